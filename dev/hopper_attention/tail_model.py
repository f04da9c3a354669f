#!/usr/bin/env python3
"""tail_model.py: the list-scheduling model session w used to find the tails of the Hopper kernels'
unit orders (README sections "Session w: the dense backward's key tiles with the K/V heads inner",
"Session w: the cluster forward's heads in step" and their "On tile lists" part). Units (CTAs, or the
cluster forward's tile pairs) go, in launch order, to whichever of `machines` frees first; a unit's
work is its key or query tiles (times the query heads a backward CTA runs) plus a fixed cost. It
prints each order's makespan over the ideal (total work / machines): what the order costs in the tail,
not a time. No GPU; the numbers the README quotes come from the defaults.

Usage: python3 dev/hopper_attention/tail_model.py [--sms 132]
"""
import argparse
import heapq
import math
import random


def makespan(works, machines):
    free = [0.0] * machines
    heapq.heapify(free)
    end = 0.0
    for w in works:
        t = heapq.heappop(free) + w
        end = max(end, t)
        heapq.heappush(free, t)
    return end / (sum(works) / machines)


def dense_backward(S, kv_heads, G, inner, sms, bn=128, bm=80, fixed=3):
    """q80's causal grid: CTA (key tile x, K/V head h) runs G heads x the query tiles from its diagonal."""
    nt, nm = S // bn, (S + bm - 1) // bm
    units = [(x, h) for h in range(kv_heads) for x in range(nt)]  # each head's tiles in turn
    if inner:
        units.sort(key=lambda u: (u[0], u[1]))
    return makespan([(nm - x * bn // bm) * G + fixed for x, _ in units], sms)


def cluster_forward(S, heads, chunk, clusters, bm=128, bn=192, fixed=1):
    """The cluster forward's causal pairs: pair j of a head (tiles 2j, 2j + 1 from the last query tile)
    costs its heavier member's key blocks; chunk heads in step (1: each head's pairs in turn)."""
    mt = S // bm
    mp = (mt + 1) // 2
    order = []
    for c in range(heads // chunk):
        for j in range(mp):
            order += [(j, c * chunk + i) for i in range(chunk)]
    return makespan([math.ceil((mt - 2 * j) * bm / bn) + fixed for j, _ in order], clusters)


def document_lists(S, n_docs, rng, bn=128, bm=64):
    """Per 128-key tile, the 64-row query tiles of its documents' causal rows (base's lists)."""
    cuts = sorted(rng.sample(range(1, S), n_docs - 1))
    docs = list(zip([0] + cuts, cuts + [S]))
    counts = []
    for t in range((S + bn - 1) // bn):
        k0, k1 = t * bn, min(S, (t + 1) * bn) - 1
        tiles = set()
        for a, b in docs:
            lo, hi = max(a, k0), min(b - 1, k1)
            if lo <= hi:
                tiles.update(range(lo // bm, (b - 1) // bm + 1))
        counts.append(len(tiles))
    return counts


def listed_backward(counts, heads, inner, sms, fixed=2):
    """listed_unit's order (outliers over 4x the mean first, heads inner; then heads outer), or heads
    inner throughout; position order within a head."""
    listed = [c for c in counts if c > 0]
    cut = 4 * sum(counts) / max(len(listed), 1)
    heavy = sum(1 for c in counts if c > cut)
    n = len(counts)
    if inner:
        seq = [r for r in range(n) for _ in range(heads)]
    else:
        seq = [r for r in range(heavy) for _ in range(heads)] + [r for _ in range(heads) for r in range(heavy, n)]
    return makespan([counts[r] + fixed if counts[r] else 0.2 for r in seq], sms)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sms", type=int, default=132)
    a = ap.parse_args()
    print("dense causal backward (q80), makespan / ideal: heads outer, heads inner")
    for S in (8192, 16384, 32768):
        for kv, G in ((8, 4), (32, 1)):
            print("  S=%6d 32:%-2d  %.3f  %.3f" % (S, kv, dense_backward(S, kv, G, False, a.sms),
                                                 dense_backward(S, kv, G, True, a.sms)))
    print("cluster forward, causal, H = 32: head by head, chunks of 4, 8, 32")
    for S in (8192, 16384, 32768):
        print("  S=%6d  %s" % (S, "  ".join("%.3f" % cluster_forward(S, 32, c, a.sms // 2) for c in (1, 4, 8, 32))))
    print("base backward on documents' lists, H = 32 (mean of 5 draws): listed_unit's order, heads inner")
    rng = random.Random(1)
    for S, n in ((8192, 16), (8192, 256), (32768, 16), (32768, 256)):
        outer = inner = 0.0
        for _ in range(5):
            c = document_lists(S, n, rng)
            outer += listed_backward(c, 32, False, a.sms) / 5
            inner += listed_backward(c, 32, True, a.sms) / 5
        print("  S=%6d %3d documents  %.3f  %.3f" % (S, n, outer, inner))


if __name__ == "__main__":
    main()
