"""Loss curves as a small SVG (no plotting library needed): one polyline per named curve,
the first solid, the others dashed, a shared y axis from 0. Used by bench/hf_llama_check.py and
bench/train_curves.py."""


def svg(path, curves, title):
    W, H, L, R, T, B = 640, 360, 60, 20, 30, 40
    top = max(max(c) for c in curves.values()) * 1.05
    n = max(len(c) for c in curves.values()) - 1 or 1
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{H}' font-family='sans-serif' font-size='12'>",
           "<rect width='100%' height='100%' fill='white'/>", f"<text x='{L}' y='18'>{title}</text>",
           f"<line x1='{L}' y1='{H-B}' x2='{W-R}' y2='{H-B}' stroke='black'/>",
           f"<line x1='{L}' y1='{T}' x2='{L}' y2='{H-B}' stroke='black'/>"]
    for i in range(5):
        v, y = top * i / 4, H - B - (H - B - T) * i / 4
        out.append(f"<text x='{L-6}' y='{y+4}' text-anchor='end'>{v:.2f}</text>")
    out.append(f"<text x='{(W+L)/2}' y='{H-8}' text-anchor='middle'>step (0 to {n})</text>")
    for k, (name, c) in enumerate(curves.items()):
        pts = " ".join(f"{L + (W-L-R) * i / n:.1f},{H - B - (H-B-T) * max(0, v) / top:.1f}" for i, v in enumerate(c))
        dash = " stroke-dasharray='5,3'" if k else ""
        out.append(f"<polyline fill='none' stroke='{colors[k % len(colors)]}' stroke-width='1.5'{dash} points='{pts}'/>")
        out.append(f"<text x='{W-R}' y='{T + 16 * k + 10}' text-anchor='end' fill='{colors[k % len(colors)]}'>{name}</text>")
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
