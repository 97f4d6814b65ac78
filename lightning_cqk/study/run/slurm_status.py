"""`lightning_cqk sweep SPEC --output DIR --status`: where each run of a sweep stands, with its SLURM job's state.

    stopped-s1   done      step 8/8    slurm 41_0 COMPLETED
    cut-s1       stopped   saved 3     slurm 41_2 CANCELLED
    matched-s1   pending               slurm 42_0 PENDING (DependencyNeverSatisfied)
    broken-s1    failed    -           slurm 43_0 FAILED  log runs/x/logs/broken-s1.log, slurm log runs/x/slurm/...

Per run: the sweep's own status (status/<run>.json: pending, running, done, failed, stopped, requeued), its step (a
running run's from its log's last progress line; a stopped one's, the step of the checkpoint it resumes from), and, for
a sweep submitted with `slurm/submit.sh`, the state of its array task as the scheduler has it now. `submit.sh` appends
each job id it gets to `slurm/jobs.txt` (the newest per script counts); the states come from `squeue -r -t all` (every
array task, pending ones included, and finished ones until the controller forgets them: `MinJobAge`, 300 s by default),
so no accounting database (`sacct`) is needed. A failed run names its log and its SLURM task's log.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

from lightning_cqk.study.design.spec import Run, Sweep
from lightning_cqk.study.run.ledger import DONE, FAILED, RUNNING, Ledger
from lightning_cqk.study.run.slurm_submit import JOBS_FILE, wave_runs


@dataclasses.dataclass(frozen=True)
class TaskState:
    """One array task as the scheduler reports it."""

    task: str  # "<array job>_<task>", what scancel / scontrol take
    state: str  # squeue's: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, REQUEUED, ...
    reason: str | None  # why it waits or ended (Dependency, DependencyNeverSatisfied, BeginTime, ...), or None
    log: Path  # the task's SLURM output file (`#SBATCH --output`)

    def describe(self) -> str:
        return f"slurm {self.task} {self.state}" + (f" ({self.reason})" if self.reason else "")


def submitted_jobs(slurm_dir: Path) -> dict[str, str]:
    """{script name: its newest job id} from `slurm/jobs.txt` ({} before the first `submit.sh`)."""
    jobs: dict[str, str] = {}
    path = slurm_dir / JOBS_FILE
    for line in path.read_text().splitlines() if path.is_file() else []:
        script, _, job = line.strip().partition(" ")
        if job.isdigit():
            jobs[script] = job
    return jobs


def task_states(sweep: Sweep) -> tuple[dict[str, TaskState], str | None]:
    """{run name: its array task's state} for the runs whose task the scheduler still knows, and a note when the
    scheduler cannot be asked (None otherwise)."""
    slurm_dir = sweep.sweep_dir / "slurm"
    jobs = submitted_jobs(slurm_dir)
    if not jobs:
        return {}, None
    squeue = shutil.which("squeue")
    if squeue is None:
        return {}, "squeue is not on PATH here: run --status on a machine of the cluster for the jobs' states"
    states: dict[str, TaskState] = {}
    for k, wave in enumerate(wave_runs(sweep)):
        job = jobs.get(f"wave{k}.sbatch")
        if job is None:
            continue
        cmd = [squeue, "--noheader", "--array", "--states=all", f"--jobs={job}", "--format=%i|%T|%r"]
        result = subprocess.run(cmd, capture_output=True, text=True)
        for line in result.stdout.splitlines() if result.returncode == 0 else []:
            task, state, reason = (line.split("|") + ["", ""])[:3]
            array_job, _, index = task.partition("_")
            if array_job != job or not index.isdigit() or int(index) >= len(wave):
                continue
            log = slurm_dir / f"{sweep.study}-{sweep.profile}-w{k}-{job}_{index}.out"
            reason = None if reason.strip() in ("", "None") else reason.strip()
            states[wave[int(index)].name] = TaskState(task, state.strip(), reason, log)
    return states, None


def _step(ledger: Ledger, run: Run, status: str) -> str:
    """The run's step: its log's last progress line (`step 200/1000`), else, for a run not running now, the step of
    the checkpoint it resumes from (`saved 200`), else `-`."""
    from lightning_cqk.checkpoint.reading import checkpoint_step
    from lightning_cqk.study.run.runner import run_progress

    progress = run_progress(ledger.log_dir / f"{run.name}.log")
    if progress is not None and (status == RUNNING or progress[0] == progress[1]):
        return f"step {progress[0]}/{progress[1]}"
    ckpt = ledger.last_checkpoint(run) if status != DONE else None
    step = checkpoint_step(ckpt, sorted(ckpt.parent.glob("step=*"))) if ckpt is not None else None
    if step is not None:
        return f"saved {step}"
    return f"step {progress[0]}/{progress[1]}" if progress else "-"


def status_lines(sweep: Sweep) -> list[str]:
    """What `sweep --status` prints (module docstring)."""
    ledger = Ledger(sweep)
    states, note = task_states(sweep)
    statuses = {run.name: ledger.status(run) for run in sweep.runs}
    done = sum(s.get("status") == "done" for s in statuses.values())
    lines = [f"{sweep.study} ({sweep.profile} profile), {sweep.sweep_dir}: {done}/{len(sweep.runs)} runs done"]
    width = max(len(run.name) for run in sweep.runs)
    for run in sweep.runs:
        status = statuses[run.name].get("status", "pending")
        step = _step(ledger, run, status)
        parts = [f"  {run.name:<{width}}", f"{status:<9}", f"{step:<12}"]
        task = states.get(run.name)
        if task is not None:
            parts.append(task.describe())
        if status == FAILED or (task is not None and task.state in ("FAILED", "TIMEOUT", "OUT_OF_MEMORY")):
            logs = f" log {ledger.log_dir / (run.name + '.log')}"
            parts.append(logs + (f", slurm log {task.log}" if task is not None else ""))
        lines.append(" ".join(parts).rstrip())
    if note:
        lines.append(f"note: {note}")
    return lines
