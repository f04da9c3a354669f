"""The Hugging Face drop-in (seqpar.hf): a tiny random LlamaForCausalLM loaded with
attn_implementation="seqpar" on 2 gloo processes, each holding its shard of the sequences,
against attn_implementation="sdpa" on the whole sequences: loss and every gradient, float32 to
1e-5; packed documents (position_ids restarting at 0) over the group and over thread ranks
against sdpa run on each document alone. Skipped where torch or transformers is not installed."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import dist_harness  # noqa: E402


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      attention_dropout=0.0, tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("tiny_llama")
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("layout,seq", [("zigzag", 48), ("striped", 45)])
def test_hf_llama_matches_sdpa(tiny_llama, layout, seq):
    values = dist_harness.values(dist_harness.run(2, "dist_cases", "hf_vs_sdpa", model_dir=tiny_llama,
                                                  layout=layout, seq=seq))
    for value in values:
        assert value["attn"] == "seqpar"
        assert abs(value["loss"] - value["ref_loss"]) <= 1e-5 * abs(value["ref_loss"]), value
        worst = max(value["grad_errs"].items(), key=lambda kv: kv[1])
        assert worst[1] <= 1e-5, f"worst gradient {worst[0]}: {worst[1]:.3g}"


def test_hf_thread_ranks_match_sdpa(tiny_llama):
    # No group: whole sequences, each attention call split over 3 thread ranks of this process.
    import seqpar.hf
    seqpar.hf.register(ranks=3, layout="zigzag")
    model = transformers.LlamaForCausalLM.from_pretrained(tiny_llama, attn_implementation="seqpar",
                                                          dtype=torch.float32)
    ref = transformers.LlamaForCausalLM.from_pretrained(tiny_llama, attn_implementation="sdpa", dtype=torch.float32)
    ids = torch.randint(0, 96, (2, 40), generator=torch.Generator().manual_seed(3))
    loss, ref_loss = (m(input_ids=ids, labels=ids, use_cache=False).loss for m in (model, ref))
    loss.backward()
    ref_loss.backward()
    assert abs(loss.item() - ref_loss.item()) <= 1e-5 * abs(ref_loss.item())
    for (name, p), (_, p_ref) in zip(model.named_parameters(), ref.named_parameters()):
        err = ((p.grad - p_ref.grad).abs().max() / p_ref.grad.abs().max()).item()
        assert err <= 1e-5, f"{name}: {err:.3g}"


@pytest.mark.parametrize("layout", ["zigzag", "striped"])
def test_hf_packed_documents_match_sdpa_per_document(tiny_llama, layout):
    # One row of packed documents (position_ids restarting at 0) sharded over 2 gloo processes.
    values = dist_harness.values(dist_harness.run(2, "dist_cases", "hf_packed_vs_sdpa", model_dir=tiny_llama,
                                                  layout=layout))
    for value in values:
        assert abs(value["loss"] - value["ref_loss"]) <= 1e-5 * abs(value["ref_loss"]), value
        worst = max(value["grad_errs"].items(), key=lambda kv: kv[1])
        assert worst[1] <= 1e-5, f"worst gradient {worst[0]}: {worst[1]:.3g}"


def test_hf_packed_documents_on_thread_ranks(tiny_llama):
    # No group: the whole packed row, its documents read from position_ids in each attention
    # call, against sdpa on each document alone; and a packed batch of two rows is refused.
    import dist_cases
    import seqpar.hf
    seqpar.hf.register(ranks=3, layout="zigzag")
    model = transformers.LlamaForCausalLM.from_pretrained(tiny_llama, attn_implementation="seqpar",
                                                          dtype=torch.float32)
    ref = transformers.LlamaForCausalLM.from_pretrained(tiny_llama, attn_implementation="sdpa", dtype=torch.float32)
    starts = [0, 1, 13, 14, 40, 45]
    ids, pos, labels = dist_cases.packed_row(96, starts)
    loss = model(input_ids=ids, position_ids=pos, labels=labels, use_cache=False).loss
    loss.backward()
    ref_loss = dist_cases.packed_per_document_reference(ref, ids, labels, starts)
    assert abs(loss.item() - ref_loss.item()) <= 1e-5 * abs(ref_loss.item())
    for (name, p), (_, p_ref) in zip(model.named_parameters(), ref.named_parameters()):
        err = ((p.grad - p_ref.grad).abs().max() / p_ref.grad.abs().max()).item()
        assert err <= 1e-5, f"{name}: {err:.3g}"
    with pytest.raises(ValueError, match="one row"):
        model(input_ids=ids.expand(2, -1), position_ids=pos.expand(2, -1), use_cache=False)


def test_finetune_example_runs_under_torchrun():
    # examples/hf_finetune.py on 2 gloo processes for 3 steps: it runs and the loss falls.
    import os
    import re
    import subprocess
    import sys
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(root, "examples", "hf_finetune.py"), "--seq", "256", "--steps", "3", "--lr", "3e-3"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    losses = [float(x) for x in re.findall(r"loss (\S+)", run.stdout)]
    assert len(losses) == 3 and losses[-1] < losses[0], run.stdout
