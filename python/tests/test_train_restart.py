"""seqpar train under torchrun on CPU ranks, surviving killed ranks: runs
tests/cli_train_torchrun_restart.sh (two processes over the tcp communicator, ranks SIGKILLed
in the forward, the backward, the optimizer step and a checkpoint save, torchrun --max-restarts=3,
final weights equal bit for bit to an undisturbed run) with this interpreter's torchrun. It lives
here rather than in ctest because torchrun comes with the torch wheel this suite installs. The
tool is the build's (build/seqpar, or SEQPAR_CLI); skipped where either is missing."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_training_survives_killed_ranks_under_torchrun():
    cli = os.environ.get("SEQPAR_CLI", os.path.join(ROOT, "build", "seqpar"))
    if not os.access(cli, os.X_OK):
        pytest.skip(f"no seqpar tool at {cli} (build it, or set SEQPAR_CLI)")
    script = os.path.join(ROOT, "tests", "cli_train_torchrun_restart.sh")
    env = {**os.environ, "TORCHRUN": f"{sys.executable} -m torch.distributed.run"}
    run = subprocess.run(["bash", script, cli], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASS" in run.stdout, run.stdout
