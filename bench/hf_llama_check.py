"""Replays a `seqpar train --dump DIR` run with Hugging Face transformers' LlamaForCausalLM (a model
nobody here wrote) and compares: the first step's loss and every parameter's gradient, from the
same starting weights and the same batch, then the loss curve of the whole run with
torch.optim.AdamW set up as ours (decay on matrices only, clipping by global norm, linear warmup
then cosine to a floor). fp32 throughout, TF32 off, eager attention. Prints a table and one JSON
line; with --plot, an SVG of both loss curves.

    python3 bench/hf_llama_check.py DIR [--device cuda|cpu] [--plot curves.svg]
    python3 bench/hf_llama_check.py DIR --bf16-rule    # DIR from `seqpar train --device cuda --dump`

With --bf16-rule (a bf16 run of ours): the first step's loss and every gradient tensor, against
transformers in fp32 as the reference, must be within 2x the error of transformers run plainly
in bf16 on the same weights and batch (CONVENTIONS.md's rule; max |error| / max |reference| per
tensor); the loss curve is not compared (ours keeps fp32 master weights, plain bf16 does not).
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from svg_curves import svg


def learning_rate(run, step):
    if step < run["warmup_steps"]:
        return run["lr"] * (step + 1) / run["warmup_steps"]
    span = max(1, run["total_steps"] - run["warmup_steps"])
    progress = min(1.0, (step - run["warmup_steps"]) / span)
    floor = run["min_lr_ratio"] * run["lr"]
    return floor + 0.5 * (run["lr"] - floor) * (1 + math.cos(math.pi * progress))


def loss_of(model, inputs, targets):
    logits = model(input_ids=inputs).logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)


def rel(a, b):
    return (a - b).norm().item() / max(b.norm().item(), 1e-30)


def max_rel(a, b):
    return (a.float() - b.float()).abs().max().item() / max(b.float().abs().max().item(), 1e-30)


def bf16_rule(args, config, weights, inputs, targets, run, ours_grad, ref_loss, ref_params):
    plain = LlamaForCausalLM(config).to(args.device, torch.bfloat16)
    plain.load_state_dict({k: v.to(torch.bfloat16) for k, v in weights.items()}, strict=False)
    if config.tie_word_embeddings:
        plain.tie_weights()
    loss = loss_of(plain, inputs, targets)
    loss.backward()
    plain_params = dict(plain.named_parameters())
    rows, ok = [], True
    for name in ours_grad:
        ref = ref_params[name].grad
        e_ours, e_plain = max_rel(ours_grad[name], ref), max_rel(plain_params[name].grad, ref)
        passed = e_ours <= 2 * e_plain
        ok = ok and passed
        rows.append((name, e_ours, e_plain, passed))
    l_ours, l_plain = abs(run["losses"][0] - ref_loss) / abs(ref_loss), abs(loss.item() - ref_loss) / abs(ref_loss)
    ok = ok and l_ours <= 2 * l_plain + 1e-7
    print(f"bf16 rule, step 0: loss error ours {l_ours:.2e}, plain bf16 {l_plain:.2e}")
    print("| tensor | ours max err / max ref | plain bf16 | within 2x |")
    print("|---|---|---|---|")
    for name, a, b, p in rows:
        print(f"| {name} | {a:.2e} | {b:.2e} | {'yes' if p else 'NO'} |")
    print(f"bf16 rule: {'PASS' if ok else 'FAIL'}")
    print(json.dumps({"kind": "hf_llama_bf16_rule", "dir": args.dir, "label": args.label, "seq": run["seq"],
                      "loss_err_ours": l_ours, "loss_err_plain": l_plain, "passed": ok,
                      "tensors": [{"name": n, "ours": a, "plain": b} for n, a, b, _ in rows]}))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--plot", default="")
    ap.add_argument("--label", default="")
    ap.add_argument("--bf16-rule", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    with open(os.path.join(args.dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(args.dir, "run.json")) as f:
        run = json.load(f)
    config = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype")})
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).to(args.device, torch.float32)
    weights = load_file(os.path.join(args.dir, "initial.safetensors"), device=args.device)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    assert not missing and not unexpected, (missing, unexpected)
    if config.tie_word_embeddings:
        model.tie_weights()
    batches = load_file(os.path.join(args.dir, "batches.safetensors"), device=args.device)
    ours_grad = load_file(os.path.join(args.dir, "grads_step0.safetensors"), device=args.device)
    steps = len(run["losses"])

    # Step 0: loss and every gradient from the same weights and batch.
    inputs, targets = batches["inputs_0"].long(), batches["targets_0"].long()
    loss = loss_of(model, inputs, targets)
    loss.backward()
    loss0 = loss.item()
    names = dict(model.named_parameters())
    grad_err = {n: rel(ours_grad[n], names[n].grad) for n in ours_grad}
    worst = max(grad_err, key=grad_err.get)
    loss_err = abs(run["losses"][0] - loss0) / abs(loss0)
    print(f"{args.dir}: S = {run['seq']}, batch {run['batch']}, {sum(p.numel() for p in model.parameters())} parameters")
    print(f"step 0 loss: ours {run['losses'][0]:.8f}  transformers {loss0:.8f}  relative {loss_err:.2e}")
    print(f"gradients, |ours - transformers| / |transformers| per tensor: worst {grad_err[worst]:.2e} ({worst}), "
          f"median {sorted(grad_err.values())[len(grad_err) // 2]:.2e}")

    if args.bf16_rule:
        return bf16_rule(args, config, weights, inputs, targets, run, ours_grad, loss0, names)

    # The run: torch AdamW as ours (decay on matrices), the same schedule, clipping, batches.
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    rest = [p for n, p in model.named_parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": run["weight_decay"]}, {"params": rest, "weight_decay": 0.0}],
                            lr=run["lr"], betas=(run["beta1"], run["beta2"]), eps=run["eps"])
    model.zero_grad(set_to_none=True)
    theirs = []
    for s in range(steps):
        for g in opt.param_groups:
            g["lr"] = learning_rate(run, s)
        loss = loss_of(model, batches[f"inputs_{s}"].long(), batches[f"targets_{s}"].long())
        loss.backward()
        if run["clip_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), run["clip_norm"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        theirs.append(loss.item())
    curve_err = max(abs(a - b) / abs(b) for a, b in zip(run["losses"], theirs))
    print(f"{steps} AdamW steps: final loss ours {run['losses'][-1]:.6f}, transformers {theirs[-1]:.6f}; "
          f"largest relative gap over the curve {curve_err:.2e}")
    if args.plot:
        svg(args.plot, {"seqpar train": run["losses"], "transformers LlamaForCausalLM": theirs},
            f"loss, {args.label or args.dir}: seqpar vs transformers (fp32, same weights and batches)")
    print(json.dumps({"kind": "hf_llama_check", "dir": args.dir, "label": args.label, "seq": run["seq"],
                      "loss_ours": run["losses"][0], "loss_hf": loss0,
                      "loss_rel_err": loss_err, "grad_worst_rel_err": grad_err[worst], "grad_worst": worst,
                      "curve_max_rel_gap": curve_err, "losses_ours": run["losses"], "losses_hf": theirs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
