"""Fine-tunes a Hugging Face Llama on long sequences with seqpar's sequence-parallel attention.

Each sequence is split over the ranks of a torch.distributed group (one process per rank,
torchrun) with a seqpar layout: every rank embeds and runs the MLPs on its shard, and the
attention layers (attn_implementation="seqpar") exchange what the algorithm needs. Positions and
targets follow each token's global position (seqpar.hf.shard_batch); the gradients are summed
over the ranks, so every rank takes the same optimizer step as one process on the whole sequence.

  torchrun --nproc_per_node=4 examples/hf_finetune.py --seq 16384                 # CPU, gloo
  torchrun --nproc_per_node=2 examples/hf_finetune.py --device cuda --seq 65536   # GPUs, NCCL
  python examples/hf_finetune.py --ranks 2 --seq 4096     # one process: thread ranks split each call

--model DIR loads a local checkpoint (LlamaForCausalLM.from_pretrained); without it a small
random Llama is made. --data FILE trains on the file's bytes as tokens (vocab 256; the default
is this repository's README.md), looping over it.

--attn sdpa trains the same model, data and steps in one process with transformers' own SDPA
attention on the whole sequence: the single-device reference for the same loss curve
(bench/compare_loss_curves.py compares curves under the bf16 rule, with an --dtype fp32 run as
the oracle). --jsonl FILE writes one JSON line per step (loss, seconds, tokens/s, peak memory).
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

import seqpar.hf


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="a local Hugging Face Llama directory (default: a small random one)")
    p.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "README.md"))
    p.add_argument("--seq", type=int, default=4096, help="tokens per sequence (the whole, before sharding)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--kv-heads", type=int, default=2, help="K/V heads of the small random Llama (8 heads)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--layout", default="zigzag", choices=["zigzag", "striped", "contiguous"])
    p.add_argument("--algo", default="auto")
    p.add_argument("--ranks", type=int, default=2, help="thread ranks when not launched by torchrun")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--attn", default="seqpar", choices=["seqpar", "sdpa"],
                   help="sdpa: transformers' SDPA on the whole sequence in one process (the reference)")
    p.add_argument("--dtype", choices=["bf16", "fp32"], help="default: bf16 on cuda, fp32 on cpu")
    p.add_argument("--jsonl", help="write one JSON line per step to this file (rank 0)")
    args = p.parse_args()
    if args.attn == "sdpa" and "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        p.error("--attn sdpa is the one-process reference: run it without torchrun")
    return args


def main():
    args = parse()
    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    device = torch.device(args.device, torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    group = None
    if args.attn == "sdpa":
        distributed = False
    elif distributed:
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
        group = dist.group.WORLD
        seqpar.hf.register(group=group, layout=args.layout, algo=args.algo)
    else:
        seqpar.hf.register(ranks=args.ranks, layout=args.layout, algo=args.algo)
    rank = dist.get_rank() if distributed else 0
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}.get(args.dtype)
    if dtype is None:
        dtype = torch.bfloat16 if args.device == "cuda" else torch.float32

    torch.manual_seed(0)  # the same weights on every rank
    if args.model:
        model = LlamaForCausalLM.from_pretrained(args.model, attn_implementation=args.attn, dtype=dtype)
    else:
        config = LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                             num_attention_heads=8, num_key_value_heads=args.kv_heads, max_position_embeddings=max(args.seq, 2048),
                             attention_dropout=0.0, tie_word_embeddings=True)
        config._attn_implementation = args.attn
        # Made in fp32 and rounded to bf16 first, so bf16 and fp32 runs start from the same weights.
        model = LlamaForCausalLM(config).to(torch.bfloat16).to(dtype)
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)

    with open(args.data, "rb") as f:
        data = torch.tensor(list(f.read()), dtype=torch.long) % model.config.vocab_size
    data = data.repeat(args.batch * args.seq // data.numel() + 2)  # short files loop
    gen = torch.Generator().manual_seed(1)  # the same batches on every rank
    log = open(args.jsonl, "w") if args.jsonl and rank == 0 else None
    for step in range(args.steps):
        t0 = time.perf_counter()
        starts = torch.randint(0, data.numel() - args.seq, (args.batch,), generator=gen)
        ids = torch.stack([data[s:s + args.seq] for s in starts.tolist()]).to(device)
        batch = (seqpar.hf.shard_batch(ids, ids, group=group) if distributed
                 else {"input_ids": ids, "labels": ids, "use_cache": False})
        loss = model(**batch).loss
        loss.backward()
        total = loss.detach().float()
        if distributed:
            seqpar.hf.all_reduce_gradients(model, group)
            dist.all_reduce(total, group=group)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if args.device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        if rank == 0:
            print(f"step {step:4d}  loss {total.item():.4f}  {seconds:.2f} s", flush=True)
        if log:
            peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None
            log.write(json.dumps({"kind": "hf_finetune", "attn": args.attn, "dtype": str(dtype).split(".")[-1],
                                  "ranks": dist.get_world_size() if distributed else 1, "seq": args.seq,
                                  "batch": args.batch, "step": step, "loss": total.item(), "seconds": seconds,
                                  "tokens_per_s": args.batch * args.seq / seconds, "peak_GiB": peak}) + "\n")
            log.flush()
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
