"""FSDP2 (`LitLM._shard`, Lightning's ModelParallelStrategy) on 2 CPU gloo ranks under torchrun equals one process,
and a distributed checkpoint resumes exactly. The worker is tests/e2e/scale/fsdp_worker.py (one subprocess, ~30 s)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings

import pytest
from tiny_run import REPO

WORKER = str(REPO / "tests" / "e2e" / "scale" / "fsdp_worker.py")
# A worker killed by a signal from native code (glibc's "malloc(): unaligned tcache chunk detected" abort was seen
# once in CI, on rank 1 of gloo under torch 2.13, and never in 30 local runs) is run once more, with a warning that
# carries its log; a wrong number, a Python exception or a second crash fails the test.
ATTEMPTS = 2
NATIVE_SIGNALS = ("Signal 6 (SIGABRT)", "Signal 11 (SIGSEGV)", "Signal 7 (SIGBUS)")


def _native_crash(log: str) -> bool:
    return any(signal in log for signal in NATIVE_SIGNALS)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("fsdp")
    out = tmp / "out.jsonl"
    env = {
        **os.environ,
        "OUT_FILE": str(out),
        "TMP_DIR": str(tmp),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    for attempt in range(1, ATTEMPTS + 1):
        out.unlink(missing_ok=True)
        proc = subprocess.run(
            [*cmd, "--master_port", str(_free_port()), WORKER], env=env, capture_output=True, text=True, timeout=240
        )
        log = proc.stdout[-3000:] + proc.stderr[-3000:]
        if proc.returncode == 0 or not _native_crash(log) or attempt == ATTEMPTS:
            break
        warnings.warn(
            f"FSDP worker crashed in native code (attempt {attempt} of {ATTEMPTS}), rerunning it:\n{log[-1500:]}",
            stacklevel=2,
        )
    assert proc.returncode == 0, log
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return {row.get("case", row["check"]): row for row in rows}


@pytest.mark.slow
@pytest.mark.parametrize("case", ["muon_quack_coupled", "muon_only", "adamw_quack", "adamw_qkclip_invertible_shared"])
def test_fsdp2_equals_one_process(results, case):
    row = results[case]
    assert row["grad0"] < 1e-5  # sharded gradients (shared banks included) = the full-batch gradients, fp32 order
    assert row["loss"] < 1e-3  # 3 steps of losses
    if case.startswith("muon"):
        # Muon orthogonalises in bf16 (torch.optim.Muon), so an fp32-rounding difference in the gradient moves a
        # bf16 Newton-Schulz update by a few % of lr; orthogonalising each shard alone would differ by several lr.
        # With the coupled bank, AdamW's first step on zero-init biases with ~0 gradients is lr * sign(rounding
        # noise): the two runs can differ by up to 2 lr there (measured 0.9-1.06); grad0 and loss carry the parity.
        assert row["update1"] < (2.0 + 1e-6 if "coupled" in case else 0.5)
    else:
        assert row["update1"] < 1e-2  # in units of the learning rate
    if case == "adamw_qkclip_invertible_shared":
        assert row["clipped_heads"] > 0  # the cap was hit, and the sharded model clipped as the single one


@pytest.mark.slow
def test_fsdp2_distributed_checkpoint_resumes_exactly(results):
    row = results["resume"]
    assert row["sharded"] and row["is_dir"] and row["steps"] == 4  # a DCP folder of a sharded run
    assert row["max_abs_diff"] == 0.0  # 2 + 2 steps with a checkpoint between == 4 steps (Muon, QuacK, coupled)
