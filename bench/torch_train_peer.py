"""The PyTorch peer for `seqpar train` on several GPUs: the same 1B-shaped (or, --model 8b, 8B-shaped) Llama (transformers'
LlamaForCausalLM with our `--model 1b` preset's shape: vocab 128,256, hidden 2048, 16 layers,
32 heads, 8 K/V heads, FFN 8192, tied head, RoPE theta 500,000), trained with what torchtitan
combines for long sequences: FSDP2 (fully_shard per decoder layer and the root, bf16 compute,
fp32 reductions and master weights) over the same ranks as context parallel (its ring
attention over the cuDNN SDPA backend, the sequence load-balanced across the ranks), selective
activation checkpointing (matrix products and attention outputs kept, the rest recomputed),
torch.compile per decoder layer, and fused AdamW. The data are the bytes of a file as tokens
(`seqpar train --data text:FILE`), one sequence of S tokens a step.

Per step, rank 0 prints a JSON line: tokens/s, MFU per GPU with `seqpar train`'s count (6 N + 6
L d S FLOPs a token against 989 TFLOP/s), and the peak memory of the worst rank
(max_memory_allocated). Several --seqs try each S in turn (the longest trainable S: a rank that
runs out of memory prints an error line and the job stops there).

  torchrun --standalone --nproc_per_node=2 bench/torch_train_peer.py --seqs 65536 --steps 4

--replay DIR trains a `seqpar train --dump DIR` run instead: its model (config.json), starting
weights, every step's batch, AdamW settings (decay on matrices only) and learning-rate schedule,
so the two loss curves can be laid side by side (bench/train_curves.py).

GQA: transformers passes enable_gqa to SDPA, which context parallel's cuDNN path does not take;
the script makes transformers repeat K/V instead (as it does for masks), so the ring carries the
repeated K/V. Positions travel as a context-parallel buffer beside the tokens and labels, so RoPE
sees each token's global position. On 2 x H200 with PyTorch 2.11 (2026-11-26, docs/RESULTS.md)
it ran with torch.compile and context parallel together; --no-compile leaves compilation out.
"""
import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import argparse
import datetime
import json
import sys
import time
from collections import namedtuple
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

PEAK = 989e12


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seqs", default="65536", help="sequence lengths to train, comma-separated, in turn")
    p.add_argument("--steps", type=int, default=4, help="steps per S; the first is a warm-up (compilation)")
    p.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "README.md"))
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--no-compile", action="store_true", help="leave out torch.compile")
    p.add_argument("--no-ac", action="store_true", help="leave out selective activation checkpointing")
    p.add_argument("--model", choices=["1b", "8b"], default="1b",
                   help="`seqpar train --model`'s shape: 1b (Llama-3.2-1B) or 8b (Llama-3-8B, untied head)")
    p.add_argument("--profile", action="store_true",
                   help="after each S's steps, one more step under PyTorch's profiler: rank 0's kernels by kind, as "
                   "`seqpar train --profile` reports ours (bench/peer_step_profile.py), in a torch_train_profile line")
    p.add_argument("--replay", default="", help="a `seqpar train --dump` folder: its model, starting weights, "
                   "batches and optimizer (in place of --model, --seqs, --steps, --data and --lr)")
    return p.parse_args()


def llama_config(name):
    from transformers import LlamaConfig
    shape = {"1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, tie_word_embeddings=True),
             "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, tie_word_embeddings=False)}
    return LlamaConfig(vocab_size=128256, num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                       max_position_embeddings=1 << 22, attention_dropout=0.0, attn_implementation="sdpa",
                       **shape[name])


Replay = namedtuple("Replay", "config weights batches run")


def replay_run(folder):
    """A `seqpar train --dump` folder: its config, starting weights, batches and run settings."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig
    with open(os.path.join(folder, "config.json")) as f:
        cfg = {k: v for k, v in json.load(f).items() if k not in ("architectures", "model_type", "torch_dtype")}
    with open(os.path.join(folder, "run.json")) as f:
        run = json.load(f)
    cfg.update(max_position_embeddings=1 << 22, attention_dropout=0.0, attn_implementation="sdpa")
    return Replay(LlamaConfig(**cfg), load_file(os.path.join(folder, "initial.safetensors")),
                  load_file(os.path.join(folder, "batches.safetensors")), run)


def replay_optimizer(model, run):
    """torch AdamW as `seqpar train` sets it up: decoupled decay on matrices only."""
    decay = [p for p in model.parameters() if p.dim() == 2]
    rest = [p for p in model.parameters() if p.dim() != 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": run["weight_decay"]},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=run["lr"], betas=(run["beta1"], run["beta2"]), eps=run["eps"], fused=True)


def selective_checkpoint(layer):
    """Wraps a decoder layer's forward: keeps matrix products and attention outputs, recomputes the rest."""
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
    aten = torch.ops.aten
    keep = {aten.mm.default, aten._scaled_dot_product_cudnn_attention.default,
            aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_efficient_attention.default}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE

    forward = layer.forward

    def wrapped(*args, **kwargs):
        return checkpoint(forward, *args, use_reentrant=False,
                          context_fn=partial(create_selective_checkpoint_contexts, policy), **kwargs)

    layer.forward = wrapped


def main():
    args = parse()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=120))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor.experimental import context_parallel
    import transformers.integrations.sdpa_attention as hf_sdpa
    from transformers import LlamaForCausalLM
    hf_sdpa.use_gqa_in_sdpa = lambda *a, **k: False  # repeat K/V before SDPA (docstring)
    # A rank's load-balanced positions jump between its two chunks, which transformers would read
    # as packed sequences and mask; context parallel's ring applies the causal mask itself.
    import transformers.masking_utils as hf_masks
    if hasattr(hf_masks, "find_packed_sequence_indices"):
        hf_masks.find_packed_sequence_indices = lambda *a, **k: None
    mesh = init_device_mesh("cuda", (world,))

    def emit(obj):
        if rank == 0:
            print(json.dumps(obj), flush=True)

    torch.manual_seed(0)
    replay = replay_run(args.replay) if args.replay else None
    if replay:
        from hf_llama_check import learning_rate  # seqpar train's schedule, as the fp32 replay uses it
    config = replay.config if replay else llama_config(args.model)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config)
    if replay:
        missing, unexpected = model.load_state_dict(replay.weights, strict=False)
        missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
        assert not missing and not unexpected, (missing, unexpected)
        if config.tie_word_embeddings:
            model.tie_weights()
    n_params = sum(p.numel() for p in model.parameters())
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        if not args.no_ac:
            selective_checkpoint(layer)
        if not args.no_compile:
            layer.compile()
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    if replay:
        opt = replay_optimizer(model, replay.run)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, fused=True)
        with open(args.data, "rb") as f:
            data = torch.tensor(list(f.read()), dtype=torch.long)
    emit(dict(kind="torch_train_info", gpus=world, torch=torch.__version__, device=torch.cuda.get_device_name(),
              params=n_params, compile=not args.no_compile, selective_ac=not args.no_ac, fsdp=True,
              context_parallel=world, sdpa="cudnn", replay=args.replay))

    seqs = [replay.run["seq"]] if replay else [int(s) for s in args.seqs.split(",") if s.strip()]
    for S in seqs:
        if not replay:
            tokens = data.repeat(S // data.numel() + 2)
        flops = (6.0 * n_params + 6.0 * config.num_hidden_layers * config.hidden_size * S) * S
        torch.cuda.reset_peak_memory_stats()

        def batch(step):
            """The step's tokens, targets and positions on the GPU (made before the step's clock starts)."""
            if replay:  # the recorded batch (one sequence) and the run's learning rate
                ids, labels = (replay.batches[f"{n}_{step}"][:1].long().cuda() for n in ("inputs", "targets"))
                for g in opt.param_groups:
                    g["lr"] = learning_rate(replay.run, step)
            else:
                start = (step * 4099) % (tokens.numel() - S - 1)
                chunk = tokens[start:start + S + 1].cuda()
                ids, labels = chunk[:-1].unsqueeze(0), chunk[1:].unsqueeze(0)  # shifted before sharding
            return ids, labels, torch.arange(S, device="cuda").unsqueeze(0)

        def one_step(ids, labels, pos):
            """One step: forward, backward, clipping, AdamW."""
            with context_parallel(mesh, buffers=[ids, labels, pos], buffer_seq_dims=[1, 1, 1]), \
                    sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
                # This rank's share of the sequence mean: the ranks' gradients sum to the whole's.
                loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-1) / world
                del logits
                loss.backward()
            clip = replay.run["clip_norm"] if replay else 1.0
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        for step in range(len(replay.run["losses"]) if replay else args.steps):
            ids, labels, pos = batch(step)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            try:
                loss = one_step(ids, labels, pos)
                torch.cuda.synchronize()
            except Exception as e:  # out of memory, mostly: report and stop (peers may be waiting)
                print(json.dumps(dict(kind="torch_train", seq=S, step=step, rank=rank,
                                      error=f"{type(e).__name__}: {e}"[:300])), flush=True)
                os._exit(3)
            seconds = time.perf_counter() - t0
            total = loss.detach().clone()
            dist.all_reduce(total)
            peak = torch.tensor([torch.cuda.max_memory_allocated()], device="cuda")
            dist.all_reduce(peak, op=dist.ReduceOp.MAX)
            emit(dict(kind="torch_train", gpus=world, seq=S, step=step, loss=total.item(), seconds=seconds,
                      tokens_per_s=S / seconds, mfu_989=flops / seconds / PEAK / world,
                      peak_GiB=peak.item() / 2**30))
        if args.profile and not replay:
            from peer_step_profile import profile_step
            try:
                table = profile_step(lambda: one_step(*batch(args.steps)), config.vocab_size)
            except Exception as e:  # the profiler's CUPTI may be refused: the timed steps stand
                table = dict(error=f"{type(e).__name__}: {e}"[:300])
            emit(dict(kind="torch_train_profile", gpus=world, seq=S, step=args.steps, **table))
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
