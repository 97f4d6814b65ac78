"""Which process of a launch this is, and how rank zero's run plan reaches the other processes.

A `fit` started by several processes (one per GPU) is one run: rank zero alone decides the run directory and the
checkpoint to resume from (`run_dir.resolve_fit`), checks the resume and locks the directory (`run/lock.py`); every
other rank takes that plan as it is. Deciding on every rank would not do: the ranks would race for directory names
(two runs, or `RunDirectoryInUse`), and a rank that looked after rank zero had locked the run would resume from no
checkpoint while rank zero resumed from one.

Who is rank zero comes from the cluster environment Lightning itself detects, in Lightning's order
(`lightning.fabric.plugins.environments`): `torchrun` (TorchElasticEnvironment: RANK), SLURM's `srun`
(SLURMEnvironment: SLURM_PROCID, also with several tasks per node and several nodes), LSF's `jsrun`, MPI, and
otherwise Lightning's own launcher (LightningEnvironment: the first process, NODE_RANK 0 and LOCAL_RANK 0, starts the
others itself).

How the plan travels (`publish_plan` / `receive_plan`):
    - Lightning's own launcher on one node: rank zero plans before it starts the other processes, which inherit the
      plan in their environment (LIGHTNING_CQK_RUN_DIR, LIGHTNING_CQK_RUN_CKPT, LIGHTNING_CQK_RUN_PLAN).
    - every launcher that starts the processes itself (torchrun, srun, jsrun, mpirun; Lightning's launcher on several
      nodes): rank zero writes the plan atomically to `<save_dir>/<experiment>/.launches/<launch key>.json` before
      any process group exists, and the other ranks wait for it (LIGHTNING_CQK_PLAN_TIMEOUT seconds, default 1800).
      The key names the launch: SLURM job, step and restart count; torchrun's run id, rendezvous address and restart
      count; LSF job; the MASTER_ADDR:MASTER_PORT of Lightning's launcher on several nodes. A plan file written
      before this process started (a killed earlier launch with the same key) is never taken: the waiting rank
      needs one written at most `STALE_MARGIN_S` seconds before its own start (and, on the same host, by a live
      process). Rank zero removes the file when it exits; a launch that fails in rank zero (a refused resume, a run
      directory in use) writes the failure instead, and every rank stops with rank zero's message.
The experiment folder must be on a file system every node sees: checkpoints are read there by every rank on resume.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_cqk.environment import env_json, env_number
from lightning_cqk.errors import UnavailableError
from lightning_cqk.files.atomic import write_json_atomically

RUN_ENV, CKPT_ENV, PLAN_ENV = "LIGHTNING_CQK_RUN_DIR", "LIGHTNING_CQK_RUN_CKPT", "LIGHTNING_CQK_RUN_PLAN"
TIMEOUT_ENV = "LIGHTNING_CQK_PLAN_TIMEOUT"
PLAN_FOLDER = ".launches"
STALE_MARGIN_S = 300.0  # a plan written this long before a waiting rank started is taken as its launch's own


class LaunchFailed(UnavailableError):
    """Rank zero could not plan the run (its message says why); this rank stops with it."""


@dataclass(frozen=True)
class Launch:
    """This process's place in a launch.

    launcher: "torchrun", "slurm", "lsf", "mpi" or "lightning" (Lightning's own launcher, or a single process).
    rank: the global rank (Lightning's launcher: 0 for its first process, else -1: "not zero", known later).
    world_size: processes in the launch (Lightning's launcher: 1 here, its trainer.devices x num_nodes later).
    key: the launch's name shared by all its processes, for the plan file (None: nothing to share it with).
    """

    launcher: str
    rank: int
    world_size: int
    key: str | None

    @property
    def is_zero(self) -> bool:
        return self.rank == 0

    @property
    def shares_plan_by_file(self) -> bool:
        """Whether other processes read rank zero's plan from a file (they are not started by rank zero)."""
        return self.key is not None


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def detect_launch() -> Launch:
    """The launch this process belongs to, from the cluster environment Lightning detects (module docstring)."""
    from lightning.fabric.plugins.environments import (
        LSFEnvironment,
        MPIEnvironment,
        SLURMEnvironment,
        TorchElasticEnvironment,
    )

    if TorchElasticEnvironment.detect():
        env = TorchElasticEnvironment()
        key = (
            f"torchrun-{_env('TORCHELASTIC_RUN_ID', 'none')}-{_env('MASTER_ADDR')}-{_env('MASTER_PORT')}"
            f"-r{_env('TORCHELASTIC_RESTART_COUNT', '0')}"
        )
        return _launch("torchrun", env.global_rank(), env.world_size(), key)
    if SLURMEnvironment.detect():
        env = SLURMEnvironment()
        key = (
            f"slurm-{_env('SLURM_JOB_ID', 'none')}-{_env('SLURM_STEP_ID', 'none')}-r{_env('SLURM_RESTART_COUNT', '0')}"
        )
        return _launch("slurm", env.global_rank(), env.world_size(), key)
    if LSFEnvironment.detect():
        env = LSFEnvironment()
        return _launch(
            "lsf", env.global_rank(), env.world_size(), f"lsf-{_env('LSB_JOBID')}-{_env('LSB_JOBINDEX', '0')}"
        )
    if MPIEnvironment.detect():
        env = MPIEnvironment()
        key = f"mpi-{_env('OMPI_MCA_orte_hnp_uri', _env('PMIX_NAMESPACE', 'none'))}-{env.main_port}"
        return _launch("mpi", env.global_rank(), env.world_size(), key)
    node, local = int(_env("NODE_RANK", _env("GROUP_RANK", "0")) or 0), int(_env("LOCAL_RANK", "0") or 0)
    if node == 0 and local == 0:
        return Launch("lightning", 0, 1, None)
    # Lightning's launcher: the processes it starts inherit the plan; the first process of another node reads a file.
    key = f"lightning-{_env('MASTER_ADDR', '127.0.0.1')}-{_env('MASTER_PORT', 'none')}" if local == 0 else None
    return Launch("lightning", -1, 1, key)


def _launch(launcher: str, rank: int, world_size: int, key: str) -> Launch:
    return Launch(launcher, rank, world_size, key if world_size > 1 else None)


def is_rank_zero_launch() -> bool:
    """True in the process that plans and owns the run (global rank zero of whatever launched it)."""
    return detect_launch().is_zero


# ------------------------------------------------------------------------------------------------ the plan
def plan_path(root: Path, key: str) -> Path:
    return Path(root) / PLAN_FOLDER / (re.sub(r"[^A-Za-z0-9._-]+", "_", key)[:200] + ".json")


def _process_start_time() -> float:
    """This process's start (seconds since the epoch; Linux /proc), else now."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[-1].split()[19])
        boot = next(
            float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line[:6] == "btime "
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration):
        return time.time()


def publish_plan(launch: Launch, root: Path, plan: dict[str, Any]) -> None:
    """Rank zero: hand `plan` (JSON-able: run_dir, ckpt_path, ...) to the other processes of the launch."""
    os.environ[RUN_ENV], os.environ[CKPT_ENV] = str(plan["run_dir"]), plan.get("ckpt_path") or ""
    os.environ[PLAN_ENV] = json.dumps(plan)  # processes Lightning's launcher starts inherit it
    if launch.key is None:
        return
    path = plan_path(root, launch.key)
    write_json_atomically(path, {**plan, "status": "ok", **_stamp(launch)})
    atexit.register(_remove_own, path)


def publish_failure(launch: Launch, root: Path, message: str) -> None:
    """Rank zero: the launch failed before the plan; the other ranks stop with `message` instead of waiting."""
    if launch.key is None:
        return
    try:
        write_json_atomically(plan_path(root, launch.key), {"status": "failed", "error": message, **_stamp(launch)})
    except OSError:
        pass  # the other ranks time out, naming the file they waited for


def _stamp(launch: Launch) -> dict[str, Any]:
    from lightning_cqk.run.lock import process_start

    return {
        "key": launch.key,
        "launcher": launch.launcher,
        "world_size": launch.world_size,
        "written": time.time(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "process_start": process_start(os.getpid()),
    }


def _remove_own(path: Path) -> None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if data.get("pid") == os.getpid() and data.get("host") == socket.gethostname() and data.get("status") == "ok":
        path.unlink(missing_ok=True)
        try:
            path.parent.rmdir()  # only when no other launch's plan is there
        except OSError:
            pass


def receive_plan(launch: Launch, root: Path, log=print) -> dict[str, Any]:
    """A rank other than zero: rank zero's plan (from the environment or the launch's plan file).

    Raises:
        LaunchFailed: rank zero failed before planning (its message), or no plan came within the timeout.
    """
    inherited = env_json(PLAN_ENV)
    if inherited is not None and not launch.shares_plan_by_file:
        return inherited
    if not launch.shares_plan_by_file:
        raise LaunchFailed(
            "This process is not rank zero of its launch, but neither inherits rank zero's run plan nor can read it "
            "from a file (no launch key). Start multi-process runs with Lightning's own launcher "
            "(--trainer.devices N), torchrun or srun (docs/scaling-out.md)."
        )
    path = plan_path(root, launch.key)
    timeout = env_number(TIMEOUT_ENV)
    not_before = _process_start_time() - STALE_MARGIN_S
    start, told = time.monotonic(), False
    while True:
        data = _read_fresh(path, not_before)
        if data is not None:
            if data.get("status") != "ok":
                raise LaunchFailed(f"rank 0 of this launch stopped before training: {data.get('error')}")
            return data
        waited = time.monotonic() - start
        if waited > timeout:
            raise LaunchFailed(
                f"rank {launch.rank} waited {timeout:.0f} s for rank 0's run plan at {path} and none came. Rank 0 "
                "may have died before planning (see its output), or it writes into another folder: every process "
                "must see the same trainer.logger save_dir (a shared file system). Raise the wait with "
                f"{TIMEOUT_ENV}=<seconds>."
            )
        if not told and waited > 30:
            log(f"launch: rank {launch.rank} is waiting for rank 0's run plan at {path}")
            told = True
        time.sleep(0.1)


def _read_fresh(path: Path, not_before: float) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if float(data.get("written", 0)) < not_before:
        return None  # an earlier launch's plan with the same key
    if data.get("status") == "ok" and data.get("host") == socket.gethostname():
        from lightning_cqk.run.lock import LockOwner

        owner = LockOwner(int(data.get("pid", -1)), data["host"], data.get("process_start"), 0.0, [])
        if owner.alive() is False:
            return None  # written by a rank zero that is gone: not this launch's
    return data
