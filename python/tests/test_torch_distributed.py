"""seqpar.torch.attention over torch.distributed with the gloo backend, one rank per process
(2 and 4 processes): outputs, LSE and gradients against PyTorch's SDPA on the full sequence
(float32 to 1e-5, float64 to 1e-10), packed documents from cu_seqlens against SDPA per
document, torch.compile(fullgraph=True), errors as Python
exceptions, a rank that never joins, and the NCCL bootstrap's trip through the group's store. Skipped where torch is not installed."""
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

import dist_harness  # noqa: E402

TOL = {"float32": 1e-5, "float64": 1e-10}


@pytest.mark.parametrize("world", [2, 4])
def test_matches_sdpa_with_gradients(world):
    for rank, value in enumerate(dist_harness.values(dist_harness.run(world, "dist_cases", "attention_vs_sdpa"))):
        for case in value["cases"]:
            for name, err in case["errors"].items():
                assert err <= TOL[case["dtype"]], f"rank {rank} {case['config']} {name}: {err:.3g}"
            assert not case["lse_requires_grad"] and case["o_dtype"] == f"torch.{case['dtype']}"
        # The communicator counts what travelled over gloo.
        assert value["counters"]["forward"]["sent"] > 0 and value["counters"]["backward"]["sent"] > 0


@pytest.mark.parametrize("world", [2, 3])
def test_documents_from_cu_seqlens_match_sdpa_per_document(world):
    for rank, value in enumerate(dist_harness.values(dist_harness.run(world, "dist_cases", "documents_vs_sdpa"))):
        for case in value:
            for name, err in case["errors"].items():
                assert err <= TOL["float32"], f"rank {rank} {case['config']} {name}: {err:.3g}"


def test_compile_fullgraph_no_graph_break():
    for value in dist_harness.values(dist_harness.run(2, "dist_cases", "compile_fullgraph")):
        assert value["graph_breaks"] == 0 and value["graphs"] == 1, value
        assert value["loss_err"] <= 1e-5 and value["grad_err"] <= 1e-5, value


def test_errors_are_python_exceptions():
    for value in dist_harness.values(dist_harness.run(2, "dist_cases", "errors")):
        for name, outcome in value.items():
            assert outcome.startswith("ok"), f"{name}: {outcome}"


@pytest.mark.parametrize("linger_s", [0.0, 30.0])
def test_a_rank_that_never_joins_fails_the_others(linger_s):
    # Rank 1 exits at once (its connections close) or lingers past the timeout: rank 0 raises.
    results = dist_harness.run(2, "dist_cases", "silent_peer", env={"SEQPAR_COMM_TIMEOUT_S": "5"},
                               timeout_s=120, linger_s=linger_s)
    assert results[0]["ok"], results[0]["error"]
    value = results[0]["value"]
    assert value["raised"] == "RuntimeError", value
    assert value["seconds"] < 25, value


def test_nccl_unique_id_travels_through_the_group_store():
    # The communicator itself needs GPUs (scripts/torch_gpu_check.sh); its id's trip does not.
    values = dist_harness.values(dist_harness.run(2, "dist_cases", "nccl_id_through_the_store"))
    for rank, got in enumerate(values):
        assert [g[1:] for g in got] == [[rank, 2], [rank, 2]]
    assert values[0][0][0] == values[1][0][0] and values[0][1][0] == values[1][1][0]  # the same id on both
    assert values[0][0][0] != values[0][1][0]  # a new id for the second communicator


def test_gather_puts_uneven_shards_back():
    for value in dist_harness.values(dist_harness.run(3, "dist_cases", "gather_round_trip")):
        assert all(value.values()), value
