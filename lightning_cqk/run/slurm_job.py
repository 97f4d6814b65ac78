"""The SLURM job this process runs in, and its requeue: one home for the fit's stop (`cli/trainer.py`) and the
sweep's array task (`study/run/runner.py`), which both ask SLURM to requeue the job after a stop signal.

- `slurm_job_id()`: the id `scontrol requeue` takes (`<array job>_<task>` in an array job).
- `requeue_job()`: `scontrol requeue <that id>`, in one line saying what happened. A run that a sweep started
  leaves the requeue to the sweep (`REQUEUE_BY_ENV` set to "sweep" in its environment): the sweep records the run
  as requeued first, then asks SLURM, so the status never says "running" for a job SLURM is about to end.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from lightning_cqk.environment import env_choice

#: Set to "sweep" by the sweep runner in each run's environment: the run saves and exits; the sweep requeues.
REQUEUE_BY_ENV = "LIGHTNING_CQK_SLURM_REQUEUE_BY"


def slurm_job_id() -> str | None:
    """The id `scontrol requeue` takes: `<array job>_<task>` in an array job, else SLURM_JOB_ID (None outside SLURM)."""
    array_job, array_task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = f"{array_job}_{array_task}" if array_job and array_task else os.environ.get("SLURM_JOB_ID")
    return job if job and re.fullmatch(r"[0-9_]+", job) else None


def requeue_job(by: str = "run") -> str:
    """Ask SLURM to requeue this job (after the checkpoint is saved); returns what happened, in one line.

    `by` is who asks: "run" (a `fit`) leaves it to the sweep that started it, when there is one."""
    job = slurm_job_id()
    if job is None:
        return "SIGUSR1 outside a SLURM job: not requeued (run the same command with --ckpt_path last to resume)"
    if by == "run" and env_choice(REQUEUE_BY_ENV) == "sweep":
        return f"SLURM job {job}: saved; the sweep task that started this run records it and requeues the job"
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return f"SLURM job {job}: scontrol is not on PATH, so the job was not requeued; resubmit it to resume"
    result = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True)
    if result.returncode != 0:
        return f"SLURM job {job}: `scontrol requeue {job}` failed ({result.stderr.strip() or result.returncode})"
    return f"SLURM job {job} requeued: its next attempt resumes this run from the checkpoint above"
