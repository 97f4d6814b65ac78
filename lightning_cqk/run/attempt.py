"""How a fit's attempt ends when it is stopped: recorded in run.json, and the command that resumes it printed.

A signal (SIGTERM, Ctrl-C, SLURM's SIGUSR1) after the first optimizer step leaves a checkpoint saved at the end of the
step in progress: the attempt is recorded as interrupted and the resume command printed (`end_interrupted`). Stopped
before the first step, nothing was trained or saved: the directory this launch created is removed (it would show as
an empty run in TensorBoard and make a pasted `--ckpt_path last` refuse) and the start command printed
(`end_before_first_step`).
"""

from __future__ import annotations

import sys

from lightning_cqk.run.directory import INTERRUPTED, RunDirectory, command_line, resumable_checkpoint


def end_interrupted(run: RunDirectory, step: int, argv: list[str], version: str | None, signal_name: str) -> None:
    """Record the attempt as interrupted by `signal_name` at `step` and print how to resume (`version`: the run
    name the command set in a config file, added to the resume command when the command line does not give it)."""
    ckpt, note = resumable_checkpoint(run.path)
    if ckpt is None and step == 0 and run.created:
        return end_before_first_step(run, argv, signal_name)
    run.end_attempt(status=INTERRUPTED, signal=signal_name, step=step, checkpoint=str(ckpt))
    resume = command_line(argv, drop=("--ckpt_path", "--on_unfinished"), add=("--ckpt_path", "last"))
    if version and "init_args.version" not in " ".join(argv):
        resume += f" --trainer.logger.init_args.version={run.path.name}"
    state = f"saved {ckpt}" if ckpt else "no checkpoint to resume from"
    print(
        f"\nrun: {run.path} interrupted by {signal_name} at step {step} ({state}"
        f"{'; ' + note if note else ''}). Resume with:\n  {resume}",
        file=sys.stderr,
        flush=True,
    )


def end_before_first_step(run: RunDirectory, argv: list[str], signal_name: str) -> None:
    """Stopped before the first optimizer step: nothing to resume; remove the directory this launch created."""
    removed = run.discard(log=lambda m: None)
    where = f"{run.path} is removed" if removed else f"{run.path} is left as it was (another launch holds it)"
    print(
        f"\nrun: stopped by {signal_name} before its first optimizer step; nothing was trained or saved, and "
        f"{where}. Start it again with:\n  {command_line(argv)}",
        file=sys.stderr,
        flush=True,
    )
