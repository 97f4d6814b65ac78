"""Who plans a multi-process launch, and how the plan reaches the other ranks (run/launch_rank.py), in-process.

The end-to-end runs under torchrun and srun are tests/e2e/reliability/test_launchers.py; these check the pieces fast.
"""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from lightning_cqk.run.launch_rank import (
    CKPT_ENV,
    PLAN_ENV,
    RUN_ENV,
    LaunchFailed,
    detect_launch,
    is_rank_zero_launch,
    plan_path,
    publish_failure,
    publish_plan,
    receive_plan,
)

LAUNCH_VARS = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def clean_env(monkeypatch):
    for name in [*LAUNCH_VARS, *[k for k in os.environ if k.startswith(("SLURM_", "TORCHELASTIC_", "LIGHTNING_CQK_"))]]:
        monkeypatch.delenv(name, raising=False)
    for name in (RUN_ENV, CKPT_ENV, PLAN_ENV):  # publish_plan sets them: restored (removed) after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch


def slurm(monkeypatch, procid: int, localid: int, nodeid: int, restart: int = 0) -> None:
    values = dict(
        SLURM_NTASKS="4", SLURM_NTASKS_PER_NODE="2", SLURM_NNODES="2", SLURM_JOB_ID="77", SLURM_STEP_ID="0",
        SLURM_PROCID=str(procid), SLURM_LOCALID=str(localid), SLURM_NODEID=str(nodeid), SLURM_JOB_NAME="train",
        SLURM_NODELIST="node[1-2]", SLURM_RESTART_COUNT=str(restart),
    )  # fmt: skip
    for key, value in values.items():
        monkeypatch.setenv(key, value)


def test_under_srun_only_slurm_procid_zero_is_rank_zero(clean_env):
    # srun sets no RANK/LOCAL_RANK/NODE_RANK: those alone made every task rank zero
    for procid, localid, nodeid in ((0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)):
        slurm(clean_env, procid, localid, nodeid)
        launch = detect_launch()
        assert (launch.launcher, launch.rank, launch.world_size) == ("slurm", procid, 4)
        assert is_rank_zero_launch() == (procid == 0)
    assert detect_launch().key == "slurm-77-0-r0"
    slurm(clean_env, 3, 1, 1, restart=1)
    assert detect_launch().key == "slurm-77-0-r1", "a requeued job is another launch"


def test_torchrun_and_lightnings_launcher(clean_env):
    clean_env.setenv("TORCHELASTIC_RUN_ID", "abc")
    for name, value in dict(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", MASTER_ADDR="h", MASTER_PORT="29500").items():
        clean_env.setenv(name, value)
    launch = detect_launch()
    assert (launch.launcher, launch.rank, launch.world_size, launch.key) == (
        "torchrun",
        1,
        2,
        "torchrun-abc-h-29500-r0",
    )
    clean_env.delenv("TORCHELASTIC_RUN_ID")
    clean_env.delenv("RANK")
    launch = detect_launch()  # a process Lightning's launcher started: inherits the plan, no file
    assert (launch.launcher, launch.is_zero, launch.key) == ("lightning", False, None)
    clean_env.setenv("LOCAL_RANK", "0")
    clean_env.setenv("NODE_RANK", "1")
    assert detect_launch().key == "lightning-h-29500"  # the first process of another node reads the file
    clean_env.setenv("NODE_RANK", "0")
    assert detect_launch().is_zero and detect_launch().key is None


def test_the_plan_file_reaches_the_other_ranks_and_a_stale_one_is_not_taken(clean_env, tmp_path):
    slurm(clean_env, 0, 0, 0)
    zero = detect_launch()
    path = plan_path(tmp_path, zero.key)
    path.parent.mkdir(parents=True)
    stale = {"status": "ok", "run_dir": "old", "written": time.time() - 3600, "host": socket.gethostname(), "pid": 1}
    path.write_text(json.dumps(stale))  # a killed launch of an hour ago with the same key
    slurm(clean_env, 1, 1, 0)
    other = detect_launch()
    clean_env.setenv("LIGHTNING_CQK_PLAN_TIMEOUT", "0.5")
    with pytest.raises(LaunchFailed, match="waited"):
        receive_plan(other, tmp_path)
    publish_plan(zero, tmp_path, {"run_dir": str(tmp_path / "run"), "ckpt_path": "x.ckpt", "apply_optimizer": False})
    plan = receive_plan(other, tmp_path)
    assert (plan["run_dir"], plan["ckpt_path"]) == (str(tmp_path / "run"), "x.ckpt")
    publish_failure(zero, tmp_path, "ResumeRefused: settings changed")
    with pytest.raises(LaunchFailed, match="ResumeRefused: settings changed"):
        receive_plan(other, tmp_path)
