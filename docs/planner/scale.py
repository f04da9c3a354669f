#!/usr/bin/env python3
"""Simulated scale: `seqpar plan --json` on the generic cluster (8 GPUs a node, NVLink inside,
50 GB/s per GPU between nodes) for 16 to 4096 GPUs at 128K to 16M tokens, MHA (32/32 heads) and
GQA (32/8), causal, D = 128. Prints Markdown tables (the pick, its time, the runner-up) and the
papers' checks, and writes one hand-made SVG per head layout (predicted fwd+bwd time of the
best of each family against GPUs, one line per length).

Usage: python3 docs/planner/scale.py build-planner/seqpar docs/planner
"""
import json
import math
import subprocess
import sys

GPUS = [16, 64, 256, 1024, 4096]
SEQS = [131072, 524288, 2097152, 16777216]
HEADS = [("MHA", 32, 32), ("GQA 4:1", 32, 8)]


def plan(cli, cluster, seq, heads, kv, extra=()):
    cmd = [cli, "plan", "--json", "--cluster", cluster, "--seq", str(seq), "--heads", str(heads),
           "--kv-heads", str(kv), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True)
    return json.loads(out.stdout)


def ok_rows(result):
    return [r for r in result["rows"] if "refusal" not in r and r["fits"]]


def tok(n):
    return f"{n // 1048576}M" if n >= 1048576 else f"{n // 1024}K"


def svg(path, title, series, xs):
    """A log-log line plot written by hand: series = {label: [y or None per x]}."""
    w, h, left, bottom, top, right = 640, 400, 70, 50, 30, 150
    ys = [y for v in series.values() for y in v if y]
    lo, hi = math.log10(min(ys)), math.log10(max(ys))
    hi = hi if hi > lo else lo + 1
    px = lambda i: left + (w - left - right) * i / (len(xs) - 1)
    py = lambda y: h - bottom - (h - bottom - top) * (math.log10(y) - lo) / (hi - lo)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<text x="{w / 2}" y="16" text-anchor="middle" font-size="13">{title}</text>',
           f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>',
           f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">GPUs</text>',
           f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">'
           'predicted fwd+bwd s (log)</text>']
    for i, x in enumerate(xs):
        out.append(f'<text x="{px(i)}" y="{h - bottom + 16}" text-anchor="middle">{x}</text>')
    for e in range(math.floor(lo), math.ceil(hi) + 1):
        if lo <= e <= hi:
            out.append(f'<text x="{left - 6}" y="{py(10 ** e) + 4}" text-anchor="end">1e{e}</text>')
    for k, (label, v) in enumerate(series.items()):
        c = colors[k % len(colors)]
        pts = [(px(i), py(y)) for i, y in enumerate(v) if y]
        out.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' %
                   (c, " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)))
        out.append(f'<text x="{w - right + 8}" y="{top + 16 * k + 10}" fill="{c}">{label}</text>')
    out.append("</svg>")
    open(path, "w").write("\n".join(out) + "\n")


def main():
    cli, outdir = sys.argv[1], sys.argv[2]
    results = {}
    for name, h, kv in HEADS:
        print(f"\n### {name} (H = {h}, H_kv = {kv}, D = 128, causal)\n")
        print("| GPUs | S | pick | fwd+bwd s | runner-up (s) | ring-return s | double-ring s | attention2d-overlap s |")
        print("|---|---|---|---|---|---|---|---|")
        for p in GPUS:
            for s in SEQS:
                r = plan(cli, f"generic:{p}", s, h, kv)
                results[(name, p, s)] = r
                rows = sorted(ok_rows(r), key=lambda x: x["fwdbwd_ms"])
                by = {x["label"]: x["fwdbwd_ms"] / 1e3 for x in rows}
                if not rows:
                    print(f"| {p} | {tok(s)} | nothing fits | | | | | |")
                    continue
                second = f"{rows[1]['label']} ({rows[1]['fwdbwd_ms'] / 1e3:.3g})" if len(rows) > 1 else ""
                cell = lambda k: f"{by[k]:.3g}" if k in by else "-"
                print(f"| {p} | {tok(s)} | {rows[0]['label']} | {rows[0]['fwdbwd_ms'] / 1e3:.3g} | {second} | "
                      f"{cell('ring-return')} | {cell('double-ring')} | {cell('attention2d-overlap')} |")
        series = {}
        for s in SEQS:
            series[tok(s)] = [min([x["fwdbwd_ms"] / 1e3 for x in ok_rows(results[(name, p, s)])] or [0]) or None
                              for p in GPUS]
        svg(f"{outdir}/scale_{'mha' if kv == h else 'gqa'}.svg",
            f"Planner pick, generic cluster, {name}", series, GPUS)

    print("\n### Attention2D's N/sqrt(P) traffic (MHA, S = 2M): bytes per rank, forward + backward\n")
    print("| GPUs | attention2d GiB | ring-return GiB | attention2d x sqrt(P) / N (GiB per M tokens) |")
    print("|---|---|---|---|")
    for p in GPUS:
        rows = {x["label"]: x for x in results[("MHA", p, 2097152)]["rows"] if "refusal" not in x}
        a = rows.get("attention2d")
        rr = rows.get("ring-return")
        gib = lambda x: (x["bytes_per_rank"]["forward"] + x["bytes_per_rank"]["backward"]) / 2 ** 30
        if a and rr:
            print(f"| {p} | {gib(a):.3f} | {gib(rr):.3f} | {gib(a) * math.sqrt(p) / 2:.3f} |")
        elif rr:
            print(f"| {p} | refused (not a square) | {gib(rr):.3f} | |")


if __name__ == "__main__":
    main()
