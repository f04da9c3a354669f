"""CPU check of bench/torch_sdpa_docs_peer.py's pieces that need no GPU and no torch: the
lengths read from a bench_gpu_ring JSON line sum to its total, a line whose lengths do not is
refused, the FLOP count matches a per-query count of the mask, and --lognormal reproduces
seqpar's make_lognormal_document_offsets (golden lengths printed by the C++ generator of
src/core/mask.cpp, built with -O3 -march=native (FMA) and without, which agreed on all of them).
Usage: python3 bench/torch_sdpa_docs_peer_check.py   (prints "ok" and exits 0, else raises)"""
import hashlib
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_sdpa_docs_peer import (MT19937_64, fwdbwd_flops, lengths_from_jsonl,  # noqa: E402
                                  lognormal_lengths, visible_pairs_per_head)

# (S, MEAN, SIGMA, SEED): (documents, first five lengths, sha256 of the comma-joined lengths, 16 hex)
GOLDEN = {
    (65536, 8192, 2.0, 1): (13, [15315, 13523, 12938, 9921, 273], "4572a78683cc6290"),
    (131072, 8192, 2.0, 1): (22, [15315, 13523, 12938, 9921, 273], "cd3ccf6221a54159"),
    (262144, 1000, 1.0, 0): (282, [4107, 76, 1709, 259, 987], "3e91d48aec53cf6c"),
    (1048576, 64, 2.0, 7): (17021, [36, 217, 358, 23, 4], "c2e63ba66e6596dc"),
}


def check_jsonl():
    lengths = [15315, 13523, 12938, 9921, 273, 18, 1415, 1113, 3107, 817, 1087, 467, 5542]
    line = {"kind": "seqpar_ring", "algo": "ring", "ran": "ring", "gpus": 2, "seq": 65536,
            "tokens_per_gpu": 32768, "heads": 32, "kv_heads": 32, "head_dim": 128, "mask": "docs:13",
            "doc_lengths": lengths, "layout": "documents", "fwdbwd_ms": 1.0}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "docs.jsonl")
        with open(path, "w") as f:
            f.write("a table line, not JSON\n")
            f.write(json.dumps({"kind": "seqpar_ring", "algo": "distflash", "seq": 65536, "error": "refused"}) + "\n")
            f.write(json.dumps(line) + "\n")
            f.write(json.dumps(dict(line, doc_lengths=[65536])) + "\n")  # later lines of that seq: ignored
        got = lengths_from_jsonl(path)
        assert got == {65536: lengths}, got
        assert sum(got[65536]) == 65536
        assert lengths_from_jsonl(path, [65536]) == {65536: lengths}
        for bad_seqs in ([131072],):
            try:
                lengths_from_jsonl(path, bad_seqs)
                raise AssertionError("a missing seq was not refused")
            except SystemExit:
                pass
        with open(path, "w") as f:
            f.write(json.dumps(dict(line, doc_lengths=lengths[:-1])) + "\n")
        try:
            lengths_from_jsonl(path)
            raise AssertionError("lengths that do not sum to seq were not refused")
        except SystemExit:
            pass


def check_flops():
    lengths = [5, 1, 7, 3]
    # Per query: the keys of its own document up to itself (MaskSpec::visible_pairs, causal docs).
    per_query = sum(i + 1 for L in lengths for i in range(L))
    assert visible_pairs_per_head(lengths) == per_query == 15 + 1 + 28 + 6
    assert fwdbwd_flops(lengths, 32, 128) == 4.0 * per_query * 32 * 128 * 3.5


def check_lognormal():
    g = MT19937_64(5489)
    for _ in range(9999):
        g()
    assert g() == 9981545732273789042, "std::mt19937_64's 10000th output (default seed)"
    for (s, mean, sigma, seed), (n, first, sha) in GOLDEN.items():
        for fma in (True, False):
            got = lognormal_lengths(s, mean, sigma, seed, fma=fma)
            assert sum(got) == s, (s, sum(got))
            digest = hashlib.sha256(",".join(map(str, got)).encode()).hexdigest()[:16]
            assert (len(got), got[:5], digest) == (n, first, sha), ((s, mean, sigma, seed, fma), len(got), got[:5], digest)


if __name__ == "__main__":
    check_jsonl()
    check_flops()
    check_lognormal()
    print("ok")
