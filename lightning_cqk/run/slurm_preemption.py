"""SLURM time limits and preemption: the run's own checkpoint and resume, never Lightning's `hpc_ckpt_N.ckpt`.

Lightning's SLURM auto-requeue saves `hpc_ckpt_N.ckpt` into the trainer's `default_root_dir` (the working directory)
when the job gets `SIGUSR1`, and restores the newest such file into *any* later run started under SLURM without a
`ckpt_path`: a different experiment launched from the same folder silently continued another's weights, optimizer
and step (issue 34, defect 2). This project already owns resuming (`run/directory.py`: the run directory, its
checkpoints, `--ckpt_path last`, the record of every attempt), so Lightning's mechanism is switched off, and its one
useful part, the requeue, is done here with the run's own checkpoint:

- `take_over(trainer)`: the SLURM environment's `auto_requeue` is off (no `hpc_ckpt_*` is written, no SIGUSR1
  handler of Lightning's) and the checkpoint connector never resumes from an `hpc_ckpt_*` file: a run starts at step
  0 unless `fit` chose a checkpoint of its own run directory.
- `stray_hpc_checkpoints(...)`: such a file beside the run (written by an older version or another program) is named
  in a note and left alone.
- `SIGUSR1` (the sbatch script's `#SBATCH --signal=SIGUSR1@90`) stops training like SIGTERM: at the end of the batch
  in progress, a checkpoint saved into the run's own `checkpoints/` (`callbacks/run_session.py`); then `requeue_job`
  (`run/slurm_job.py`) asks SLURM to requeue the job, whose `srun ... --ckpt_path last` resumes that run; a run that a
  sweep's array task started leaves the requeue to that task, which records the run as requeued first.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from lightning_cqk.run.slurm_job import requeue_job, slurm_job_id  # noqa: F401 (the fit's stop requeues with them)

HPC_PATTERN = "hpc_ckpt_*.ckpt"
REQUEUE_SIGNAL_NAME = "SIGUSR1"


def take_over(trainer: Any) -> None:
    """Switch off Lightning's SLURM auto-requeue and its resume from `hpc_ckpt_*` files for this trainer."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    environment = trainer._accelerator_connector.cluster_environment
    if isinstance(environment, SLURMEnvironment):
        environment.auto_requeue = False  # read when Lightning registers its signal handlers, at fit start
    connector = trainer._checkpoint_connector
    if hasattr(type(connector), "_hpc_resume_path"):  # Lightning resumes from it when ckpt_path is None under SLURM
        connector.__class__ = _without_hpc_resume(type(connector))


@functools.cache
def _without_hpc_resume(connector_class: type) -> type:
    """The trainer's checkpoint connector, less the `hpc_ckpt_*` file it would resume from."""
    return type(f"{connector_class.__name__}WithoutHpc", (connector_class,), {"_hpc_resume_path": property(_none)})


def _none(self: Any) -> None:
    return None


def stray_hpc_checkpoints(*folders: str | Path | None) -> list[Path]:
    """`hpc_ckpt_*.ckpt` files directly inside the given folders (each folder once)."""
    found: list[Path] = []
    seen: set[Path] = set()
    for folder in folders:
        if folder is None:
            continue
        path = Path(folder).resolve()
        if path in seen or not path.is_dir():
            continue
        seen.add(path)
        found.extend(sorted(path.glob(HPC_PATTERN)))
    return found


def stray_note(files: list[Path]) -> str:
    names = ", ".join(str(f) for f in files)
    return (
        f"note: {names}: checkpoint(s) of Lightning's SLURM auto-requeue, which lightning_cqk does not use. They are "
        "never restored into a run (a new run starts at step 0; a resume reads its own run directory's "
        "checkpoints/) and are left as they are: delete them once nothing needs them."
    )
