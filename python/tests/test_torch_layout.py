"""seqpar.torch's layout helpers (shard, unshard, positions) on torch tensors: the same rows
as the C++ Layout behind seqpar.shard, round trips for every layout and uneven lengths, and
clear errors. Skipped where torch is not installed."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import seqpar  # noqa: E402
import seqpar.torch as st  # noqa: E402


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("seq,ranks", [(64, 4), (37, 3), (9, 2)])
def test_shard_matches_the_core_and_round_trips(layout, seq, ranks):
    x = torch.randn(2, seq, 3, 4, dtype=torch.float64)
    shards = [st.shard(x, layout=layout, ranks=ranks, rank=r) for r in range(ranks)]
    for r, s in enumerate(shards):
        assert np.array_equal(s.numpy(), seqpar.shard(x.numpy(), layout, ranks, r))
        pos = st.positions(seq, layout=layout, ranks=ranks, rank=r)
        assert pos.tolist() == seqpar.positions(layout, seq, ranks, r)
        assert torch.equal(s, x[:, pos])
    assert torch.equal(st.unshard(shards, layout=layout), x)
    # Position ids and labels shard the same way along their sequence dim.
    ids = torch.arange(seq).expand(2, seq)
    assert torch.equal(st.shard(ids, layout=layout, ranks=ranks, rank=1 % ranks),
                       st.positions(seq, layout=layout, ranks=ranks, rank=1 % ranks).expand(2, -1))
    # lse-like tensors carry the sequence in dim 2.
    lse = torch.randn(2, 3, seq)
    parts = [st.shard(lse, layout=layout, ranks=ranks, rank=r, dim=2) for r in range(ranks)]
    assert torch.equal(st.unshard(parts, layout=layout, dim=-1), lse)


def test_layout_errors():
    x = torch.randn(1, 8, 2)
    with pytest.raises(ValueError, match="rank"):
        st.shard(x, ranks=2, rank=2)
    with pytest.raises(ValueError):
        st.shard(x, layout="zigzag", ranks=8, rank=0)  # fewer tokens than 2P chunks
    with pytest.raises(ValueError, match="layout"):
        st.shard(x, layout="diagonal", ranks=2, rank=0)
    with pytest.raises(ValueError, match="group= or both"):
        st.shard(x)
    with pytest.raises(TypeError):
        st.unshard(x)
    with pytest.raises(ValueError, match="holds"):
        st.unshard([x, x[:, :3]], layout="contiguous")
