"""The per-document PyTorch peer for bench_gpu_ring's document masks: PyTorch SDPA
(torch.nn.functional.scaled_dot_product_attention, cuDNN backend by default, --backend flash
for FlashAttention-2) run document by document over one packed sequence on ONE GPU, causal
within each document, forward + backward, bf16, B = 1, H = 32, D = 128 (flags change them).

What it times, per total length S: q, k, v and dO are made once as packed [1, S, H, D] tensors
(K/V with --kv-heads heads), every one uniform in [-1, 1) as bench_gpu_ring's inputs. One step
loops over the documents: each document's slices, seen as [1, H, L, D] (seqpar's [B, S, H, D]
storage, transposed as bench/torch_sdpa_peer.py does), go through SDPA with is_causal=True and
torch.autograd.grad(o, (q, k, v), dO) (its gradients, freed after the document). The step is
timed with CUDA events around the whole loop: one warm-up step, then the median of
10 steps (S <= 65536) or 3 (bench_gpu_ring's counts; --iters changes it).
GQA (--kv-heads < --heads): --gqa repeat (default) repeats K/V to H heads inside the timed step
(repeat_interleave, as Hugging Face's and torchtitan's Llama and bench/torch_cp_peer.py do);
--gqa native passes enable_gqa=True to SDPA instead (PyTorch >= 2.5; a backend that does not take
it prints an "error" line).

Document lengths, in order:
  --lengths-from FILE.jsonl  the first JSON line of FILE with "doc_lengths" for each total length
                             ("seq"), as bench_gpu_ring prints it with --mask docs:N or
                             docs-lognormal:...; --seqs picks lengths (default: every seq in it)
  --lognormal MEAN[,SIGMA[,SEED]] --seqs S,...  generated here the way seqpar's
                             make_lognormal_document_offsets (src/core/mask.cpp) does: a 64-bit
                             Mersenne twister, Box-Muller, llround. The C++ build with
                             SEQPAR_NATIVE (the default, -march=native on an FMA machine) contracts
                             two expressions to fused multiply-adds, reproduced here by default;
                             --no-fma follows a build without them. Checked against the C++ on
                             the CPU (bench/torch_sdpa_docs_peer_check.py); --lengths-from is the
                             authority when in doubt.

FLOPs, counted as bench_gpu_ring's mask_flops counts them (4 * visible pairs * H * D, forward +
backward 3.5 times that, H = query heads whatever --kv-heads is):
  visible pairs per head   P = sum over documents of L * (L + 1) / 2   (causal inside each)
  visible score pairs      H * P
  fwdbwd_tflops            4 * H * P * D * 3.5 / fwdbwd seconds / 1e12   (one GPU)
Memory: peak_GiB is torch.cuda.max_memory_allocated() over the timed steps; peak_extra_GiB
that minus what the inputs q, k, v, dO hold (bench_gpu_ring's peak_extra_GiB is per GPU).

Usage:
  python3 bench/torch_sdpa_docs_peer.py --lengths-from docs.jsonl [--seqs 65536] [--heads 32]
      [--kv-heads 8] [--head-dim 128] [--backend cudnn|flash] [--gqa repeat|native] [--iters N]
  python3 bench/torch_sdpa_docs_peer.py --lognormal 8192 --seqs 65536,131072
  python3 bench/torch_sdpa_docs_peer.py --print-lengths --lognormal 8192,2,1 --seqs 65536  (no GPU)
Prints one JSON object per line and total length:
  {"kind":"torch_sdpa_docs","backend":...,"seq":S,"docs":N,"heads":H,"kv_heads":...,"head_dim":D,
   "gqa":...,"iters":...,"fwdbwd_ms":...,"visible_score_pairs":...,"fwdbwd_tflops":...,
   "peak_GiB":...,"peak_extra_GiB":...,"lengths_from":...}
A length whose run fails (out of memory, a backend refusing) prints {..., "error": "..."} and the
script goes on with the next."""
import argparse
import json
import math
import os
import sys
from fractions import Fraction

MASK64 = (1 << 64) - 1


class MT19937_64:
    """std::mt19937_64: the 64-bit Mersenne twister of C++11 (seeded as its seed(uint64_t))."""

    def __init__(self, seed):
        self.mt = [seed & MASK64]
        for i in range(1, 312):
            prev = self.mt[-1]
            self.mt.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & MASK64)
        self.index = 312

    def _twist(self):
        mt = self.mt
        for i in range(312):
            x = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % 312] & 0x7FFFFFFF)
            xa = x >> 1
            if x & 1:
                xa ^= 0xB5026F5AA96619E9
            mt[i] = mt[(i + 156) % 312] ^ xa
        self.index = 0

    def __call__(self):
        if self.index >= 312:
            self._twist()
        x = self.mt[self.index]
        self.index += 1
        x ^= (x >> 29) & 0x5555555555555555
        x ^= (x << 17) & 0x71D67FFFEDA60000
        x ^= (x << 37) & 0xFFF7EEE000000000
        x ^= x >> 43
        return x & MASK64


def _fma(a, b, c):
    """a * b + c rounded once (exact rationals; int / int division rounds correctly)."""
    return float(Fraction(a) * Fraction(b) + Fraction(c))


def _llround(x):
    """C's llround: to nearest, halves away from zero (x > 0 here)."""
    r = math.floor(x)
    return int(r) + (1 if x - r >= 0.5 else 0)


def lognormal_lengths(seq_len, mean, sigma=2.0, seed=1, fma=True):
    """The document lengths seqpar's make_lognormal_document_offsets(seq_len, mean, sigma, seed)
    makes (src/core/mask.cpp), in order; fma: as built with fused multiply-adds (SEQPAR_NATIVE)."""
    bits = MT19937_64(seed)

    def uniform():  # in (0, 1)
        return (float(bits() >> 11) + 0.5) * 2.0 ** -53

    # mu = log(mean) - 0.5 * sigma * sigma; contracted: fnmadd(0.5 * sigma, sigma, log(mean)).
    mu = _fma(-(0.5 * sigma), sigma, math.log(mean)) if fma else math.log(mean) - 0.5 * sigma * sigma
    lengths, at = [], 0
    while at < seq_len:
        u1 = uniform()  # GCC calls the left operand's uniform() first (checked against the C++)
        u2 = uniform()
        z = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
        length = math.exp(_fma(sigma, z, mu) if fma else mu + sigma * z)
        tokens = seq_len if length >= float(seq_len) else max(1, _llround(length))
        nxt = min(seq_len, at + tokens)
        lengths.append(nxt - at)
        at = nxt
    return lengths


def lengths_from_jsonl(path, seqs=None):
    """{seq: doc_lengths} from the first line with "doc_lengths" for each seq (lines that are not
    JSON objects are skipped); with seqs, only those, and each must be found."""
    found = {}
    with open(path) as f:
        for text in f:
            text = text.strip()
            if not text.startswith("{"):
                continue
            try:
                line = json.loads(text)
            except json.JSONDecodeError:
                continue
            if "doc_lengths" not in line or "seq" not in line:
                continue
            s = int(line["seq"])
            if (seqs is None or s in seqs) and s not in found:
                lengths = [int(x) for x in line["doc_lengths"]]
                if sum(lengths) != s or min(lengths, default=0) < 1:
                    raise SystemExit(f"{path}: the doc_lengths of seq {s} sum to {sum(lengths)}, not {s}")
                found[s] = lengths
    missing = [s for s in (seqs or []) if s not in found]
    if missing:
        raise SystemExit(f"{path}: no line with doc_lengths for seq {missing}")
    return dict(sorted(found.items())) if seqs is None else {s: found[s] for s in seqs}


def visible_pairs_per_head(lengths):
    return sum(L * (L + 1) // 2 for L in lengths)


def fwdbwd_flops(lengths, heads, head_dim):
    """bench_gpu_ring's mask_flops(..., backward=true): 4 * pairs * H * D * 3.5."""
    return 4.0 * visible_pairs_per_head(lengths) * heads * head_dim * 3.5


def iterations_for(s):
    return 10 if s <= 65536 else 3  # bench_gpu_ring's run_one below --big-from


def time_documents(lengths, args):
    """(fwdbwd seconds, peak bytes, peak extra bytes) of one packed sequence, per document."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from peer_timing import median_seconds

    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[args.backend]
    s, h, d = sum(lengths), args.heads, args.head_dim
    hkv = args.kv_heads or h

    def uniform(heads):  # [1, S, heads, D] in [-1, 1), as bench_gpu_ring's inputs
        return torch.rand(1, s, heads, d, device="cuda", dtype=torch.bfloat16).mul_(2).sub_(1)

    q, k, v, dout = uniform(h), uniform(hkv), uniform(hkv), uniform(h)
    starts = [0]
    for L in lengths:
        starts.append(starts[-1] + L)
    # Per document: leaf views [1, heads, L, D] of the packed tensors.
    docs = []
    for a, b in zip(starts[:-1], starts[1:]):
        docs.append(tuple(t[:, a:b].transpose(1, 2).detach().requires_grad_(True) for t in (q, k, v))
                    + (dout[:, a:b].transpose(1, 2),))
    native = args.gqa == "native" and hkv != h

    def step():
        for qd, kd, vd, dod in docs:
            if hkv != h and not native:
                kk, vv = (t.repeat_interleave(h // hkv, dim=1) for t in (kd, vd))
            else:
                kk, vv = kd, vd
            extra = {"enable_gqa": True} if native else {}
            o = F.scaled_dot_product_attention(qd, kk, vv, is_causal=True, **extra)
            torch.autograd.grad(o, (qd, kd, vd), dod)

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with sdpa_kernel([backend]):
        t = median_seconds(step, args.iters or iterations_for(s), warmup=1)
    peak = torch.cuda.max_memory_allocated()
    return t, peak, peak - base


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--lengths-from", metavar="FILE.jsonl",
                     help="bench_gpu_ring's JSON lines: the first line with doc_lengths per seq")
    src.add_argument("--lognormal", metavar="MEAN[,SIGMA[,SEED]]",
                     help="generate the lengths as --mask docs-lognormal:MEAN,SIGMA,SEED does (SIGMA 2, SEED 1 by default)")
    ap.add_argument("--seqs", help="total lengths, comma-separated (needed with --lognormal; with --lengths-from: "
                                   "default every seq in the file)")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=0, help="K/V heads (0: as many as heads)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--backend", choices=["cudnn", "flash"], default="cudnn")
    ap.add_argument("--gqa", choices=["repeat", "native"], default="repeat",
                    help="with --kv-heads: repeat K/V to the query heads inside the step, or SDPA's enable_gqa=True")
    ap.add_argument("--iters", type=int, default=0, help="timed steps (0: 10 up to 65536 tokens, else 3)")
    ap.add_argument("--no-fma", action="store_true",
                    help="--lognormal as a build without fused multiply-adds (SEQPAR_NATIVE=OFF) makes it")
    ap.add_argument("--print-lengths", action="store_true",
                    help="print each length's documents as a JSON line and stop (no GPU, no torch)")
    args = ap.parse_args()
    seqs = [int(x) for x in args.seqs.split(",")] if args.seqs else None
    if args.lognormal:
        if not seqs:
            ap.error("--lognormal needs --seqs")
        fields = args.lognormal.split(",")
        if not 1 <= len(fields) <= 3:
            ap.error("--lognormal MEAN[,SIGMA[,SEED]]")
        mean = float(fields[0])
        sigma = float(fields[1]) if len(fields) > 1 else 2.0
        seed = int(fields[2]) if len(fields) > 2 else 1
        if not (mean >= 1 and 0 <= sigma <= 8 and seed >= 0):
            ap.error("--lognormal: MEAN >= 1, 0 <= SIGMA <= 8, SEED >= 0 (as docs-lognormal)")
        by_seq = {s: lognormal_lengths(s, mean, sigma, seed, fma=not args.no_fma) for s in seqs}
        source = f"lognormal:{fields[0]},{sigma:g},{seed}" + (",no-fma" if args.no_fma else "")
    else:
        by_seq = lengths_from_jsonl(args.lengths_from, seqs)
        source = args.lengths_from
    if args.kv_heads and (args.kv_heads < 1 or args.heads % args.kv_heads):
        ap.error("--heads must be a multiple of --kv-heads")
    hkv = args.kv_heads or args.heads
    for s, lengths in by_seq.items():
        if args.print_lengths:
            print(json.dumps(dict(kind="doc_lengths", seq=s, docs=len(lengths), lengths_from=source,
                                  doc_lengths=lengths)), flush=True)
            continue
        line = dict(kind="torch_sdpa_docs", backend=args.backend, seq=s, docs=len(lengths),
                    max_doc=max(lengths), heads=args.heads, kv_heads=hkv, head_dim=args.head_dim,
                    gqa=args.gqa if hkv != args.heads else "none", lengths_from=source)
        try:
            t, peak, extra = time_documents(lengths, args)
            pairs = visible_pairs_per_head(lengths) * args.heads
            line.update(iters=args.iters or iterations_for(s), fwdbwd_ms=t * 1e3, visible_score_pairs=pairs,
                        fwdbwd_tflops=fwdbwd_flops(lengths, args.heads, args.head_dim) / t / 1e12,
                        peak_GiB=peak / 2**30, peak_extra_GiB=extra / 2**30)
        except Exception as e:  # report, keep going
            line["error"] = f"{type(e).__name__}: {e}"[:300]
        print(json.dumps(line), flush=True)
        if "torch" in sys.modules:
            import gc
            gc.collect()
            sys.modules["torch"].cuda.empty_cache()


if __name__ == "__main__":
    main()
