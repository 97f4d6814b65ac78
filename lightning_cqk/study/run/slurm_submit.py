"""SLURM array scripts for a sweep (`lightning_cqk sweep SPEC --profile paper --slurm`): one array task per run,
each running `lightning_cqk sweep SPEC --run NAME` (lightning_cqk/study/run/runner.py).

Every array script asks SLURM for what a run needs to stop and come back by itself (docs/scaling-out.md):
- `--signal=USR1@<slurm_signal_seconds>` (profile setting, default 90): SIGUSR1 that long before the time limit;
  the array task's sweep process forwards it to its run, which saves at the end of its optimizer step; the sweep
  records the run "requeued" and asks SLURM to requeue the task (`runner.StopSignal`), whose next attempt resumes
  the run from its own checkpoint;
- `--requeue`: a preemption or a node failure puts the task back in the queue (instead of ending it);
- `--open-mode=append`: a requeued task's attempts add to one log instead of the last replacing the first.
The profile's `slurm:` lines come after these, so one of them (`#SBATCH --no-requeue`, another `--signal`) overrides
them: sbatch takes the last of a repeated option.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from lightning_cqk.study.design.spec import Run, Sweep
from lightning_cqk.study.run.ledger import Ledger

#: `submit.sh` appends one line per job it submits, "<script> <job id>": the newest line of a script is its job.
JOBS_FILE = "jobs.txt"


def wave_runs(sweep: Sweep) -> list[list[Run]]:
    """The runs of each wave, in array-task order: a wave's runs wait only for runs of earlier waves."""
    waves: list[list[Run]] = []
    wave_of: dict[str, int] = {}
    for run in sweep.runs:  # already in dependency order
        k = max((wave_of[d] + 1 for d in run.depends_on), default=0)
        wave_of[run.name] = k
        while len(waves) <= k:
            waves.append([])
        waves[k].append(run)
    return waves


def write_slurm(sweep: Sweep, spec_arg: str, max_parallel: int | None = None) -> list[Path]:
    """Write one SLURM array script per wave (runs whose waits are all in earlier waves), `report.sbatch` and
    `submit.sh`.

    Each array task runs `lightning_cqk sweep <spec> --profile P --output DIR --run <name>`: the same skip / resume
    logic as a local sweep, one run per task. `submit.sh` submits the waves chained with `--dependency=afterok`, then
    the report job (`lightning_cqk report DIR`) after the last wave. Returns the files written.
    """
    waves = wave_runs(sweep)
    out = sweep.sweep_dir / "slurm"
    out.mkdir(parents=True, exist_ok=True)
    files = []
    cwd = Path.cwd()
    for k, wave in enumerate(waves):
        limit = f"%{max_parallel}" if max_parallel else ""
        names = " ".join(shlex.quote(r.name) for r in wave)
        task = shlex.join(
            [
                "python",
                "-m",
                "lightning_cqk",
                "sweep",
                spec_arg,
                "--profile",
                sweep.profile,
                "--output",
                str(sweep.sweep_dir),
                "--no-report",
                "--run",
            ]
        )
        lines = [
            "#!/bin/bash",
            f"#SBATCH --job-name={sweep.study}-{sweep.profile}-w{k}",
            f"#SBATCH --array=0-{len(wave) - 1}{limit}",
            f"#SBATCH --output={out}/%x-%A_%a.out",
            f"#SBATCH --signal=USR1@{sweep.slurm_signal_seconds}",
            "#SBATCH --requeue",
            "#SBATCH --open-mode=append",
            *sweep.slurm,
            "# Written by `lightning_cqk sweep --slurm`: one array task per run; a task skips a finished run and",
            "# resumes an interrupted one from its checkpoints/last.ckpt. Submit all waves with submit.sh. Before a",
            "# time limit (SIGUSR1) the run saves and the task requeues itself; a preemption requeues it too. After",
            "# a scancel, run submit.sh again (finished runs are skipped, the others resume).",
            "set -euo pipefail",
            f"cd {shlex.quote(str(cwd))}",
            f"RUNS=({names})",
            f'srun {task} "${{RUNS[$SLURM_ARRAY_TASK_ID]}}"',
            "",
        ]
        path = out / f"wave{k}.sbatch"
        path.write_text("\n".join(lines))
        files.append(path)
    report = [
        "#!/bin/bash",
        f"#SBATCH --job-name={sweep.study}-{sweep.profile}-report",
        f"#SBATCH --output={out}/%x-%j.out",
        "#SBATCH --open-mode=append",
        *sweep.slurm,
        "# Written by `lightning_cqk sweep --slurm`: the study's report, once every wave has succeeded.",
        "set -euo pipefail",
        f"cd {shlex.quote(str(cwd))}",
        shlex.join(["python", "-m", "lightning_cqk", "report", str(sweep.sweep_dir)]),
        "",
    ]
    (out / "report.sbatch").write_text("\n".join(report))
    files.append(out / "report.sbatch")
    submit = ["#!/bin/bash", "# Submit the sweep's waves, each after the previous one succeeded.", "set -euo pipefail"]
    submit.append("dep=''")
    jobs = shlex.quote(str(out / JOBS_FILE))
    for path in files:
        submit.append(f'jid=$(sbatch --parsable $dep {shlex.quote(str(path))}); echo "submitted {path.name}: $jid"')
        submit.append(f'echo "{path.name} ${{jid%%;*}}" >> {jobs}  # read by `lightning_cqk sweep ... --status`')
        submit.append('dep="--dependency=afterok:${jid%%;*}"')
    (out / "submit.sh").write_text("\n".join(submit) + "\n")
    (out / "submit.sh").chmod(0o755)
    files.append(out / "submit.sh")
    Ledger(sweep).write_manifest()
    return files
