"""`make gpu-check` (issue 32): the prepared device check, tested here as plumbing (no GPU number comes from a CPU).

The stages run in order under one budget, a failing or timed-out stage does not stop the next, a stage that no
longer fits is skipped with the command that runs it alone, and one table comes out. The prep step's pip command
names the locked versions for the GPU image's Python 3.12. The end-to-end dry run executes every stage on the CPU
with tiny shapes (the FSDP2 smoke stage resumes at step 20 for real, on 1-rank gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_check  # noqa: E402

sys.path.remove(str(REPO / "benchmarks"))


def test_prep_downloads_the_locked_versions_for_the_gpu_images_python():
    pins = gpu_check.locked_pins(REPO / "requirements.lock")
    assert len(pins) == len(gpu_check.CARRIED) and "lightning==2.6.6" in pins
    assert "obstore==0.12.1" in pins, "the lock line whose marker holds for Python 3.12 (0.11.1 is for < 3.11)"
    command = gpu_check.prep_command(pins, Path("/tmp/w"))
    assert command[command.index("--python-version") + 1] == "3.12" and "--no-deps" in command
    assert command[-len(pins) :] == pins and "--only-binary=:all:" in command


def test_a_failing_stage_does_not_stop_the_next_and_what_no_longer_fits_is_skipped(tmp_path: Path):
    py = [sys.executable, "-c"]
    stages = [
        gpu_check.Stage("fails", [*py, "import sys; print('broken here'); sys.exit(3)"], 30, 1),
        gpu_check.Stage("hangs", [*py, "import time; time.sleep(30)"], 2, 1),
        gpu_check.Stage(
            "works", [*py, 'print(\'{"summary": "fine"}\')'], 30, 1, lambda log: gpu_check._last_json(log)["summary"]
        ),  # fmt: skip
        gpu_check.Stage("too_big", [*py, "pass"], 600, 500),
    ]
    outcomes = gpu_check.run_stages(stages, budget_s=60, out=tmp_path, env=dict(os.environ), reserve_s=0)
    assert [o.status for o in outcomes] == ["FAIL(rc=3)", "TIMEOUT", "ok", "SKIPPED"]
    assert "broken here" in outcomes[0].result and outcomes[2].result == "fine"
    assert "gpu_check.py --stages too_big" in outcomes[3].result
    table = gpu_check.summary_table(outcomes, "test")
    assert table.count("\n| ") == 5 and (tmp_path / "fails.log").read_text().strip() == "broken here"


@pytest.mark.slow
def test_the_dry_run_executes_every_stage_and_writes_one_table(tmp_path: Path):
    env = dict(os.environ, OUT=str(tmp_path), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--dry-run", "--budget", "400"],
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = (tmp_path / "summary.md").read_text()
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [r[0].strip("| ") for r in rows] == ["env", "gpu_suite", "bench", "kernels", "memory", "smoke"]
    assert all(r[1] == "ok" for r in rows), table
    assert "resumed at step 20 to 30" in table and "no GPU number" in table
