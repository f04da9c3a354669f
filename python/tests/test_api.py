"""seqpar's package surface: version, algorithm list, layout helpers, and the errors a caller
gets for arguments seqpar cannot run (ValueError / TypeError with the reason, never a crash)."""
import importlib.metadata

import numpy as np
import pytest

import seqpar


def test_version_matches_cmake_project():
    assert seqpar.__version__ == "0.1.0"
    assert importlib.metadata.version("seqpar") == seqpar.__version__


def test_algorithms_listed_with_summaries():
    algos = seqpar.algorithms()
    assert {"ring", "burst", "distflash", "double-ring"} <= set(algos)
    assert all(isinstance(s, str) and s for s in algos.values())


@pytest.mark.parametrize("layout", seqpar.layouts())
@pytest.mark.parametrize("ranks", [1, 2, 3, 5])
def test_shard_unshard_round_trip(layout, ranks):
    x = np.arange(2 * 23 * 3, dtype=np.float32).reshape(2, 23, 3)
    shards = [seqpar.shard(x, layout, ranks, r, seq_dim=1) for r in range(ranks)]
    for r, s in enumerate(shards):
        np.testing.assert_array_equal(s, x[:, seqpar.positions(layout, 23, ranks, r)])
    np.testing.assert_array_equal(seqpar.unshard(shards, layout, seq_dim=1), x)
    assert sorted(sum((seqpar.positions(layout, 23, ranks, r) for r in range(ranks)), [])) == list(range(23))


def test_zigzag_positions():
    # 2P chunks of 2 tokens; rank r holds chunks r and 2P - 1 - r.
    assert seqpar.positions("zigzag", 8, 2, 0) == [0, 1, 6, 7]
    assert seqpar.positions("zigzag", 8, 2, 1) == [2, 3, 4, 5]


def qkv(dtype=np.float64, S=16, H=4, H_kv=2, D=8):
    rng = np.random.default_rng(1)
    return (rng.standard_normal((1, S, H, D)).astype(dtype),
            rng.standard_normal((1, S, H_kv, D)).astype(dtype),
            rng.standard_normal((1, S, H_kv, D)).astype(dtype))


def test_wrong_rank_of_array():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="4-D"):
        seqpar.attention(q[0], k, v)


def test_mismatched_shapes():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="k and v"):
        seqpar.attention(q, k, v[:, :, :1].copy())
    with pytest.raises(ValueError, match="seq"):
        seqpar.attention(q, k[:, :8].copy(), v[:, :8].copy())
    with pytest.raises(ValueError, match="dout"):
        seqpar.attention(q, k, v, dout=q[:, :8].copy())


def test_heads_not_divisible():
    q, k, v = qkv(H=4, H_kv=3)
    with pytest.raises(ValueError, match="divisible"):
        seqpar.attention(q, k, v)


def test_dtypes():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="one dtype"):
        seqpar.attention(q, k.astype(np.float32), v)
    with pytest.raises(TypeError, match="float32 or float64"):
        seqpar.attention(*(x.astype(np.float16) for x in (q, k, v)))
    with pytest.raises(TypeError, match="dtype"):
        seqpar.attention(*(x.astype(np.int32) for x in (q, k, v)))
    with pytest.raises(TypeError, match="array"):
        seqpar.attention(q.tolist(), k, v)


def test_non_contiguous():
    q, k, v = qkv()
    q_t = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)  # BHSD memory
    with pytest.raises(ValueError, match="contiguous"):
        seqpar.attention(q_t, k, v)


def test_bad_names_and_ranks():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="unknown algo"):
        seqpar.attention(q, k, v, algo="ringg")
    with pytest.raises(ValueError, match="layout"):
        seqpar.attention(q, k, v, layout="spiral")
    with pytest.raises(ValueError, match="ranks"):
        seqpar.attention(q, k, v, ranks=0)
    with pytest.raises(ValueError):
        seqpar.attention(q, k, v, ranks=9, layout="zigzag")  # 16 tokens, 18 chunks
    with pytest.raises(ValueError, match="window"):
        seqpar.attention(q, k, v, window=(-2, 0))


def test_algorithm_refusal_has_reason():
    q, k, v = qkv()
    with pytest.raises(ValueError) as e:
        seqpar.attention(q, k, v, algo="distflash", layout="zigzag", causal=True, ranks=2)
    assert len(str(e.value)) > 10


def test_shard_errors():
    x = np.zeros((2, 10, 3), dtype=np.float64)
    with pytest.raises(ValueError, match="rank"):
        seqpar.shard(x, "contiguous", 2, 2)
    with pytest.raises(ValueError, match="seq_dim"):
        seqpar.shard(x, "contiguous", 2, 0, seq_dim=3)
    with pytest.raises(ValueError):
        seqpar.unshard([x, x[:, :3].copy()], "contiguous")  # 13 tokens: rank 0 would hold 7
    with pytest.raises(TypeError):
        seqpar.unshard(x, "contiguous")


def test_backward_alone_errors():
    q, k, v = qkv()
    o, lse = seqpar.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="lse"):
        seqpar.attention_backward(q, k, v, o, lse.transpose(0, 2, 1).copy(), q)
    with pytest.raises(TypeError, match="one dtype"):
        seqpar.attention_backward(q, k, v, o, lse.astype(np.float32), q)
