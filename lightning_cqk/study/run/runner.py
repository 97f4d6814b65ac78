"""Run a sweep: every run of an expanded spec as a `lightning_cqk fit` subprocess, resumable, locally or on SLURM.

    lightning_cqk sweep configs/ablations/coupling.yaml --profile cpu [--dry-run] [--jobs 2] [--output runs/x]
    lightning_cqk sweep configs/ablations/coupling.yaml --profile paper --slurm     # writes SLURM array scripts
    lightning_cqk sweep configs/ablations/coupling.yaml --profile paper --run standard-s1   # one run (array task)
    lightning_cqk sweep configs/ablations/coupling.yaml --profile paper --status   # each run, and its SLURM state

Layout of a sweep directory (default `runs/<study>-<profile>/`):
    manifest.json       the plan and the state: study, profile, spec, git revision, package versions, and per run its
                        levels, seed, overrides, command, config hash, status (pending / running / done / failed) and
                        `revisions`: the code revision of each attempt (a run resumed after a `git pull` lists both)
                        and `packages`: each distinct set of package versions its attempts ran with (a run resumed
                        after an upgrade lists both; `run/version_records.py`)
    status/<run>.json   one file per run, written by whichever process runs it (so SLURM array tasks never write the
                        same file); manifest.json is rebuilt from them
    logs/<run>.log      the run's stdout and stderr (appended across attempts)
    <run>/              the run itself: TensorBoard events, config.yaml, checkpoints/last.ckpt, budget.json
    report/             what `lightning_cqk report` writes

Each run is launched as `python -m lightning_cqk fit --config <base> ... --seed_everything <seed>
--trainer.logger.init_args.{save_dir,name,version}=...`, so its directory is fixed by the sweep (the CLI's `-2`
suffixing never moves it). On a second invocation a run that finished (status done, same config hash, budget.json
present) is skipped; a run with a checkpoint is resumed from it (`--ckpt_path <that file>`: `checkpoints/last.ckpt`,
or the newest intact `step=*.ckpt` when last.ckpt is missing or damaged, `run_dir.resumable_checkpoint`); any other
unfinished run starts again from scratch (its partial directory is removed first). A run whose config hash changed
(the spec or a config file was edited since) is refused, finished or interrupted: start a new sweep directory with
`--output` (or `--restart-changed` restarts the interrupted ones from scratch). One owner per sweep directory
(`run_local`): a second sweep into it is refused, and a run directory that a live process still writes (the orphan
of a killed runner) is never deleted or started twice: the sweep refuses, naming its pid.

With `--jobs N > 1` runs go N at a time (each child gets OMP_NUM_THREADS = cores / N unless it is set); the first
run of each distinct data setting runs alone first (unless its data_dir already holds finished shards), because
a run prepares missing token shards itself and two runs must not write the same shards at once. Runs that wait for
another (`{run:<level>}` in a spec) start when it is done, and are marked failed without running if it failed.

Progress: every minute while runs are in flight (LIGHTNING_CQK_SWEEP_PROGRESS_SECONDS), one `[sweep] progress:` line
gives the runs finished out of the study's, each running run's step / total and eta (from its log's progress
lines) and the study's eta (`Progress`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from lightning_cqk.environment import env_number
from lightning_cqk.run.directory import RUN_IDENTITY_ENV, config_files, resumable_checkpoint
from lightning_cqk.run.lock import RunDirectoryInUse, acquire, holder
from lightning_cqk.run.slurm_job import REQUEUE_BY_ENV, requeue_job, slurm_job_id
from lightning_cqk.run.version_records import package_versions
from lightning_cqk.study.design import start_mode
from lightning_cqk.study.design.spec import Run, SpecError, Sweep, expand
from lightning_cqk.study.run import worker
from lightning_cqk.study.run.adopt import committed_folders, index_committed
from lightning_cqk.study.run.ledger import (
    DONE,
    FAILED,
    MANIFEST,
    ON_CHANGED,
    REQUEUED,
    RUNNING,
    STOPPED,
    SWEEP_LOCK,
    Ledger,
    stop_advice,
    utc_now,
)
from lightning_cqk.study.run.shard_settings import data_key, shards_ready
from lightning_cqk.study.run.sharing import WAIT, computed_source, device_of
from lightning_cqk.study.run.slurm_submit import write_slurm


def fit_command(sweep: Sweep, run: Run, ckpt_path: str | None = None) -> list[str]:
    """The subprocess command line of one run."""
    from lightning_cqk.study.run.tuned_overrides import resolve_overrides

    run = dataclasses.replace(run, overrides=resolve_overrides(run.overrides, sweep.spec, sweep.sweep_dir))
    cmd = [sys.executable, "-m", "lightning_cqk", "fit", *run.cli_args(sweep.sweep_dir)]
    if ckpt_path:
        cmd.append(f"--ckpt_path={ckpt_path}")
    return cmd


class _Launch:
    """One run's process in flight (started by `worker.start_run`: `sweep --start fork` or `fresh`)."""

    def __init__(self, ledger: Ledger, run: Run, threads: int | None, restart_changed: bool = False) -> None:
        self.ledger, self.run = ledger, run
        # This runner owns the run while it handles it (a second runner, e.g. a SLURM task, is refused by name).
        self.lock = acquire(ledger.status_dir, name=f"{run.name}.lock", what=f"Sweep run {run.name} in")
        problem = ledger.problems(run)
        if problem is not None and restart_changed and holder(ledger.run_dir(run)) is None:
            print(f"[sweep] {run.name}: settings changed since its interrupted attempt; restarting it from scratch")
            shutil.rmtree(ledger.run_dir(run))  # no live writer (checked just now): ours to delete
            problem = None
        if problem is not None:
            self.lock.release()
            raise SpecError(problem)
        ckpt, note = resumable_checkpoint(ledger.run_dir(run))
        if note:
            print(f"[sweep] {run.name}: {note}", flush=True)
        if ckpt is None and ledger.run_dir(run).exists():
            shutil.rmtree(ledger.run_dir(run))  # a partial run without a checkpoint, no live writer: logs would mix
        self.resumed_from = str(ckpt) if ckpt else None
        try:
            cmd = fit_command(ledger.sweep, run, self.resumed_from)  # fills a tuned learning rate in (tuned_rate.py)
        except SpecError:
            self.lock.release()
            raise
        env = dict(os.environ)
        env.setdefault("LIGHTNING_CQK_DEBUG", "1")  # the run's log keeps a user error's traceback (cli/errors.py)
        env[REQUEUE_BY_ENV] = "sweep"  # after a SIGUSR1 the run saves and exits; this runner requeues (StopSignal)
        if threads is not None and "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = str(threads)
        ledger.log_dir.mkdir(parents=True, exist_ok=True)
        self.log = open(ledger.log_dir / f"{run.name}.log", "a")  # noqa: SIM115 (closed in finish)
        self.log.write(f"\n# {utc_now()} {shlex.join(cmd)}\n")
        self.log.flush()
        attempts = ledger.status(run).get("attempts", 0) + 1
        revisions = list(ledger.status(run).get("revisions", []))
        if ledger.code_revision() not in revisions:
            revisions.append(ledger.code_revision())
        packages = list(ledger.status(run).get("packages", []))
        if package_versions() not in packages:
            packages.append(package_versions())
        identity = ledger.identity_fields(run)  # its data may not be prepared yet: recorded again at the end
        env[RUN_IDENTITY_ENV] = identity["identity"]  # run.json records it (callbacks/run_session.py)
        ledger.set_status(
            run,
            status=RUNNING,
            attempts=attempts,
            revisions=revisions,
            packages=packages,
            config_hash=run.config_hash(),
            **identity,
            launch_key=ledger.launch_key(run),  # what a twin waits for while this run is in flight (sharing.py)
            started=utc_now(),
            resumed_from=self.resumed_from,
            returncode=None,
        )
        ledger.write_manifest()
        self.start = time.perf_counter()
        self.proc = worker.start_run(cmd, env, self.log)  # forked from a pre-imported worker, or fresh (worker.py)
        verb = f"resuming from {self.resumed_from}" if self.resumed_from else "starting"
        print(f"[sweep] {run.name}: {verb} (attempt {attempts})", flush=True)

    def finish(self, stopped_by: str | None = None) -> bool:
        """Record how the run ended: done, failed, or (`stopped_by` a signal's name, the sweep's stop) stopped."""
        rc = self.proc.wait()
        self.log.close()
        seconds = time.perf_counter() - self.start
        run_dir = self.ledger.run_dir(self.run)
        ok = rc == 0 and (run_dir / "budget.json").is_file()
        stopped = stopped_by is not None and not ok
        status = DONE if ok else STOPPED if stopped else FAILED
        fields: dict[str, Any] = {"status": status, "returncode": rc, "finished": utc_now()}
        if stopped:
            ckpt, _ = resumable_checkpoint(run_dir)
            fields.update(stopped_by=stopped_by, resume_from=str(ckpt) if ckpt else None)
        fields["device"] = device_of(run_dir)
        fields["seconds"] = round(self.ledger.status(self.run).get("seconds", 0.0) + seconds, 1)
        configs = config_files(run_dir)  # config.yaml, then config.resume-<n>.yaml per resume: the latest
        if configs:
            import hashlib

            fields["resolved_config_sha256"] = hashlib.sha256(configs[-1].read_bytes()).hexdigest()
        if ok:  # what computed it, its data now prepared; the thread count as the run itself recorded it
            fields.update(recorded_identity(self.ledger, self.run, run_dir))
        self.ledger.set_status(self.run, **fields)
        self.ledger.write_manifest()
        self.lock.release()
        if ok:
            print(f"[sweep] {self.run.name}: done in {seconds:.0f} s", flush=True)
        elif stopped:
            where = f"resumes from {fields['resume_from']}" if fields["resume_from"] else "starts again (no checkpoint)"
            print(
                f"[sweep] {self.run.name}: stopped by {stopped_by} (exit code {rc}); its next attempt {where}",
                flush=True,
            )
        else:
            log = self.ledger.log_dir / f"{self.run.name}.log"
            print(f"[sweep] {self.run.name}: FAILED (exit code {rc}); see {log}", flush=True)
        return ok


def recorded_identity(ledger: Ledger, run: Run, run_dir: Path) -> dict[str, Any]:
    """The identity fields of a finished run: computed now (its shards exist now), with the device, precision and
    thread count its last attempt recorded in run.json where they differ from the prediction (then the identity is
    that of what computed it, and a warning says so)."""
    from lightning_cqk.run.directory import read_record
    from lightning_cqk.study.run.identity import identity_digest

    fields = ledger.identity_fields(run)
    attempts = (read_record(run_dir) or {}).get("attempts") or [{}]
    last = attempts[-1]
    parts = dict(fields["identity_parts"])
    for key in ("threads", "device"):
        if last.get(key) is not None and last[key] != parts.get(key):
            print(f"[sweep] warning: {run.name} computed with {key} {last[key]}, not {parts.get(key)} as predicted: "
                  "its identity records what computed it", flush=True)  # fmt: skip
            parts[key] = last[key]
    fields["identity_parts"] = parts
    fields["identity"] = identity_digest(parts)
    return fields


# ------------------------------------------------------------------------------------------------ progress
PROGRESS_ENV = "LIGHTNING_CQK_SWEEP_PROGRESS_SECONDS"
PROGRESS_SECONDS: float | None = None  # set: overrides $LIGHTNING_CQK_SWEEP_PROGRESS_SECONDS (default 60)
_STEP_LINE = re.compile(r"step (\d+)/(\d+) \((\d+)%\)(?:.*?\beta (\d+:\d\d:\d\d))?")


def run_progress(log: Path, tail_bytes: int = 8192) -> tuple[int, int, str | None] | None:
    """(step, total steps, the run's own eta or None) from the last progress line of a run's log (`LineProgress`:
    `step 200/1000 (20%) | ... | eta 0:01:12 | ...`), or None before the first one."""
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail_bytes))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    found = None
    for match in _STEP_LINE.finditer(text):
        found = match
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2)), found.group(4)


def _fraction_left(run_dir: Path, steps: int | None) -> float:
    """The share of a run's steps still to train: 1 for a new run, less for one resumed from a checkpoint."""
    from lightning_cqk.checkpoint.reading import checkpoint_step
    from lightning_cqk.run.directory import resumable_checkpoint

    if not steps or not run_dir.is_dir():
        return 1.0
    ckpt, _ = resumable_checkpoint(run_dir)
    step = checkpoint_step(ckpt) if ckpt is not None else None
    return 1.0 if step is None else max(0.0, 1.0 - step / steps)


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """What `[sweep] progress` lines say, every PROGRESS_SECONDS while runs are in flight: runs done out of the
    total, each running run's step / total and its own eta (from its log), and the study's eta: the dry-run estimate
    (`cost_estimate.py`) of the runs still to go and of the running runs' remaining steps, scaled by how the finished
    runs
    of this invocation compared with their estimates, divided by the runs at a time."""

    def __init__(self, ledger: Ledger, todo: list[Run], jobs: int) -> None:
        self.every = env_number(PROGRESS_ENV)  # checked before anything starts
        self.ledger, self.jobs, self.total = ledger, max(1, jobs), len(ledger.sweep.runs)
        self.started_at = time.monotonic()
        self.last = self.started_at
        try:
            from lightning_cqk.study.design.cost_estimate import estimate_runs

            estimates = estimate_runs(ledger.sweep)
        except Exception as err:  # an estimate that cannot be made leaves the study eta out, never the sweep
            print(f"[sweep] progress: no study eta ({type(err).__name__}: {err})", flush=True)
            estimates = []
        self.estimates = {r.name: r.seconds for r in estimates}
        steps = {r.name: r.steps for r in estimates}
        # A run that an earlier invocation stopped resumes from its checkpoint: only its remaining steps are to go.
        self.left = {r.name: _fraction_left(ledger.sweep.sweep_dir / r.name, steps.get(r.name)) for r in todo}
        self.measured: list[tuple[float, float]] = []  # (seconds taken, seconds estimated) of finished runs

    def finished(self, launch: _Launch, ok: bool) -> None:
        estimate, start = self.estimates.get(launch.run.name), getattr(launch, "start", None)
        if ok and estimate and start is not None:  # a resumed run is measured against its remaining share
            self.measured.append((time.perf_counter() - start, estimate * self.left.get(launch.run.name, 1.0)))

    def line(self, todo: list[Run], running: list[_Launch], finished: set[str], failed: set[str]) -> str:
        parts, remaining = [], 0.0
        scale = sum(m for m, _ in self.measured) / sum(e for _, e in self.measured) if self.measured else 1.0
        for launch in running:
            progress = run_progress(self.ledger.log_dir / f"{launch.run.name}.log")
            estimate = self.estimates.get(launch.run.name)
            if progress is None:
                parts.append(f"{launch.run.name} starting")
                remaining += (estimate or 0.0) * scale * self.left.get(launch.run.name, 1.0)
                continue
            step, steps, eta = progress
            parts.append(f"{launch.run.name} step {step}/{steps}" + (f" eta {eta}" if eta else ""))
            remaining += (estimate or 0.0) * scale * (1 - step / steps if steps else 1.0)
        remaining += sum(self.estimates.get(r.name, 0.0) * self.left.get(r.name, 1.0) for r in todo) * scale
        done = len(finished) + len(failed)
        head = f"[sweep] progress: {done}/{self.total} runs finished" + (f" ({len(failed)} failed)" if failed else "")
        elapsed = f"elapsed {_clock(time.monotonic() - self.started_at)}"
        known = self.estimates and all(r.name in self.estimates for r in todo)
        study_eta = f"study eta {_clock(remaining / self.jobs)}" if known else "study eta unknown"
        return "; ".join([head, *parts, elapsed, study_eta])

    def maybe_print(self, todo: list[Run], running: list[_Launch], finished: set[str], failed: set[str]) -> None:
        now = time.monotonic()
        every = self.every if PROGRESS_SECONDS is None else PROGRESS_SECONDS
        if running and now - self.last >= every:
            self.last = now
            print(self.line(todo, running, finished, failed), flush=True)


# data settings that order and batch the windows but do not change the token shards a run prepares
def _gpu_missing(sweep: Sweep) -> str | None:
    """Why a sweep whose runs ask for a GPU (`trainer.accelerator: gpu|cuda`) cannot run here, before anything starts
    (a CUDA device is looked for in a child process, so the runner itself never imports torch); None otherwise."""
    asks = {str(r.overrides.get("trainer.accelerator", "")).lower() for r in sweep.runs} & {"gpu", "cuda"}
    if not asks:
        return None
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True, text=True
    )
    if probe.stdout.strip() == "True":
        return None
    return (
        f"{sweep.spec_path} (profile {sweep.profile}) runs on a GPU (trainer.accelerator {asks.pop()}), and this "
        "machine has no CUDA device torch can use (torch.cuda.is_available() is False): run it where a GPU is, or "
        "choose the cpu profile (--profile cpu). Nothing was started."
    )


def _names(todo: list[Run], running: list[_Launch]) -> set[str]:
    return {r.name for r in todo} | {x.run.name for x in running}


def run_local(
    sweep: Sweep,
    jobs: int = 1,
    only: list[str] | None = None,
    restart_changed: bool = False,
    adopt: list[str | Path] | None = None,
    on_changed: str = "refuse",
) -> dict[str, list[str]]:
    """Run every unfinished run of `sweep` (or only the named ones), `jobs` at a time.

    A finished run whose recorded identity differs from the one computed now (study/run/identity.py: other code, data,
    settings, packages, device or thread count) is refused before anything starts, naming what changed, or with
    `on_changed="recompute"` computed again as a new attempt (its old directory kept under superseded/).

    One owner per sweep directory: a whole-sweep invocation holds `<sweep dir>/.sweep.lock` for its life (a second
    sweep into the same directory is refused, naming the first); `--run NAME` invocations (SLURM array tasks) are
    refused while a whole sweep holds it, and every runner holds `status/<run>.lock` while it handles a run. Before
    anything starts, every run to do is checked (`Ledger.problems`): a run directory with a live writer (an orphan
    of a killed runner) and an interrupted run whose settings were edited since are refused by name, so nothing is
    deleted or resumed under other settings.

    A stop signal (SIGUSR1, SIGTERM) is forwarded to the runs in flight, which save and exit; they are recorded
    stopped (or requeued: `StopSignal`) and no other run starts.

    Returns {'skipped': [...], 'done': [...], 'failed': [...], 'stopped': [...]} (names).
    """
    missing = sweep.missing_needs()
    if missing:
        raise SpecError(
            f"{sweep.spec_path} (profile {sweep.profile}) needs {missing}, which do not exist. The cpu profiles of the "
            "corpus studies read $LIGHTNING_CQK_SHARED_DATA (set it to the folder holding the corpora; with network "
            "access, `make study-data DIR=<folder>` fetches them, checked: "
            "docs/studies-and-reports.md#the-studies-data); "
            "the coupling study's cpu profile needs nothing."
        )
    missing_gpu = _gpu_missing(sweep)
    if missing_gpu:
        raise SpecError(missing_gpu)
    ledger = Ledger(sweep)
    if on_changed not in ON_CHANGED:
        raise SpecError(f"--on-changed must be one of {', '.join(ON_CHANGED)}, got {on_changed!r}.")
    ledger.on_changed = on_changed
    ledger.threads = run_threads(jobs)
    if adopt:  # read (and cross-check) the committed results before anything starts
        try:
            notes: list[str] = []
            ledger.committed = index_committed(committed_folders(adopt), notes)
            for note in notes:
                print(f"[sweep] adopt: {note}", flush=True)
        except (FileNotFoundError, ValueError) as err:
            raise SpecError(f"nothing was started: {err}") from None
    ledger.dir.mkdir(parents=True, exist_ok=True)
    sweep_lock = None
    try:
        if only:
            owner = holder(ledger.dir, SWEEP_LOCK)
            if owner is not None:
                raise RunDirectoryInUse(
                    f"Sweep directory {ledger.dir} is being run by a whole sweep ({owner.describe()}); it runs "
                    f"{', '.join(only)} too: {stop_advice(owner, ledger.dir / SWEEP_LOCK)}."
                )
        else:
            sweep_lock = acquire(ledger.dir, name=SWEEP_LOCK, what="Sweep directory")
    except RunDirectoryInUse as err:
        message = str(err)
        owner = holder(ledger.dir, SWEEP_LOCK)
        if owner is not None and not only:
            message = (
                f"Sweep directory {ledger.dir} is being run by another sweep ({owner.describe()}): "
                f"{stop_advice(owner, ledger.dir / SWEEP_LOCK)}, and run this command again (finished runs are "
                "skipped, interrupted ones resume)."
            )
        raise SpecError(f"{message} Two sweeps into one directory would run the same runs twice.") from None
    try:
        return _run_owned(ledger, jobs, only, restart_changed)
    finally:
        if sweep_lock is not None:
            sweep_lock.release()


def _run_owned(ledger: Ledger, jobs: int, only: list[str] | None, restart_changed: bool) -> dict[str, list[str]]:
    """`run_local` once the sweep directory is owned."""
    sweep = ledger.sweep
    runs = [sweep.run(n) for n in only] if only else list(sweep.runs)
    result: dict[str, list[str]] = {"skipped": [], "done": [], "failed": [], "stopped": []}
    changed = []
    for run in runs:
        try:
            what = ledger.changed(run)
        except SpecError as err:  # its settings no longer resolve: not the run it was
            what = [str(err)]
        if what is not None:
            changed.append((run, what))
    if changed and ledger.on_changed == "refuse":
        raise SpecError(
            "nothing was started:\n" + "\n".join(f"  {ledger.changed_message(run, what)}" for run, what in changed)
        )
    for run, what in changed:
        print(f"[sweep] {run.name}: computed by other code, data or settings ({'; '.join(what)}): computing it "
              "again as a new attempt", flush=True)  # fmt: skip
        ledger.supersede(run)
    todo = []
    for run in runs:
        if ledger.is_done(run):
            result["skipped"].append(run.name)
            print(f"[sweep] {run.name}: done before, skipped", flush=True)
        else:
            todo.append(run)
    blocked = [(run.name, p) for run in todo if (p := ledger.problems(run)) is not None]
    if blocked and restart_changed:
        blocked = [(n, p) for n, p in blocked if "--restart-changed" not in p]
    if blocked:
        raise SpecError("nothing was started:\n" + "\n".join(f"  {name}: {problem}" for name, problem in blocked))
    mixed = ledger.mixed_revisions(runs) if todo else None
    if mixed:
        print(f"[sweep] warning: {mixed}", flush=True)
    mixed = ledger.mixed_packages(runs) if todo else None
    if mixed:
        print(f"[sweep] warning: {mixed}", flush=True)
    ledger.write_manifest()
    threads = run_threads(jobs)
    finished = {r.name for r in sweep.runs if ledger.is_done(r)}
    failed: set[str] = set()
    running: list[_Launch] = []
    stop = StopSignal(running)
    stop.name = _early_stops[0] if _early_stops else None  # came while the sweep was starting: no run starts
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {s: signal.getsignal(s) for s in StopSignal.SIGNALS} if main_thread else {}
    for signum in previous:
        signal.signal(signum, stop.handle)  # SLURM / timeout: the runs save, then this runner records them
    try:
        _schedule(ledger, todo, running, finished, failed, result, jobs, threads, restart_changed, stop)
    except KeyboardInterrupt:
        for launch in running:
            launch.proc.terminate()  # Lightning stops; the run stays "running" and resumes from last.ckpt next time
        for launch in running:
            try:
                launch.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                launch.proc.kill()
            launch.log.close()
        ledger.write_manifest()
        print("[sweep] interrupted: run the same command again to resume", flush=True)
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if stop.name is not None and (result["stopped"] or todo):
        result["stopped_by"] = [stop.name]
        stop.requeue(ledger, result["stopped"], unstarted=[r.name for r in todo])
    elif stop.name is not None:  # e.g. a time limit's warning after the task's run finished: nothing to requeue
        print(f"[sweep] {stop.name} came when every run was finished: nothing to stop or requeue", flush=True)
    ledger.write_manifest()
    return result


class StopSignal:
    """A stop asked of the sweep by a signal, handled without losing a step or a record:

    - SIGUSR1: SLURM's warning before a time limit (the array script's `#SBATCH --signal=USR1@<margin>`, sweep/
      slurm_submit.py) or `scancel --signal=USR1`; SIGTERM: `scancel`, a preemption, `timeout`. SLURM signals every
      process
      of the job step, the runs included; the signal is forwarded to each run in flight all the same (a `kill` of
      this process alone reaches them too). A run saves at the end of its optimizer step and exits
      (`callbacks/run_session.py`); this runner waits for it and records it "stopped" (`_Launch.finish`). No run
      starts after the signal.
    - Then, for SIGUSR1 inside a SLURM job, `requeue` records each stopped run "requeued" and asks SLURM to requeue
      the job (`scontrol requeue`): its next attempt resumes the run from its own checkpoint. The runs leave the
      requeue to this runner (REQUEUE_BY_ENV), so the status is written before SLURM ends the job.
    """

    SIGNALS = (signal.SIGUSR1, signal.SIGTERM)

    def __init__(self, running: list[_Launch]) -> None:
        self.running, self.name = running, None

    def handle(self, signum: int, frame: Any) -> None:
        self.name = self.name or signal.Signals(signum).name
        for launch in self.running:
            launch.proc.send_signal(signum)

    def requeue(self, ledger: Ledger, stopped: list[str], unstarted: list[str]) -> None:
        """After the runs in flight ended: requeue the SLURM job for them and the runs not started yet (SIGUSR1 in a
        job), or say how to resume."""
        job = slurm_job_id()
        if self.name != "SIGUSR1" or job is None or not (stopped or unstarted):
            print(f"[sweep] stopped by {self.name}: run the same command again to resume", flush=True)
            return
        runs = [ledger.sweep.run(name) for name in stopped]
        for run in runs:  # recorded first: SLURM ends this job once it is requeued
            ledger.set_status(run, status=REQUEUED, requeued_job=job)
        ledger.write_manifest()
        outcome = requeue_job(by="sweep")
        print(f"[sweep] {outcome}", flush=True)
        if " requeued" not in outcome and "pending execution" not in outcome:  # pending: SLURM requeued it already
            for run in runs:
                ledger.set_status(run, status=STOPPED, requeued_job=None, reason=outcome)


_early_stops: list[str] = []  # stop signals that came before the runner's own handler (`sweep_command`)


def _note_early_stop(signum: int, frame: Any) -> None:
    """A stop signal while the sweep reads its spec: kept, so that no run starts and SLURM still requeues the task."""
    _early_stops.append(signal.Signals(signum).name)


def _exit_code(signal_name: str) -> int:
    """What a sweep stopped by a signal exits with (the fit's: 128 + the signal's number)."""
    return 128 + int(signal.Signals[signal_name])


def run_threads(jobs: int) -> int | None:
    """OMP_NUM_THREADS the runner gives each run (unless the environment sets it): cores / jobs with --jobs > 1."""
    return max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None


def _schedule(
    ledger: Ledger,
    todo: list[Run],
    running: list[_Launch],
    finished: set[str],
    failed: set[str],
    result: dict[str, list[str]],
    jobs: int,
    threads: int | None,
    restart_changed: bool = False,
    stop: StopSignal | None = None,
) -> None:
    """Launch runs as slots, waits and data preparation allow, until every run has finished or failed (after a stop
    signal: until the runs in flight have ended; the others stay as they are)."""
    data_ready: set[str] = set()  # data settings whose shards a finished run has prepared
    preparing: str | None = None  # the data setting of the one run now allowed to prepare shards
    progress = Progress(ledger, todo, jobs)
    while todo or running:
        for launch in [x for x in running if x.proc.poll() is not None]:
            running.remove(launch)
            stopped_by = stop.name if stop is not None else None
            ok = launch.finish(stopped_by) if stopped_by else launch.finish()
            progress.finished(launch, ok)
            if not ok and stopped_by is not None:
                result["stopped"].append(launch.run.name)
                continue
            (finished if ok else failed).add(launch.run.name)
            result["done" if ok else "failed"].append(launch.run.name)
            if ok:  # its shards exist now; after a failure the next run of that data setting prepares alone again
                data_ready.add(data_key(launch.run))
            if preparing == data_key(launch.run):
                preparing = None
        if stop is not None and stop.name is not None:
            if not running:
                return
            time.sleep(0.5)
            continue
        launched = False
        for run in list(todo):
            if len(running) >= jobs:
                break
            blocked = [
                d for d in run.depends_on if d in failed or (d not in finished and d not in _names(todo, running))
            ]
            if blocked:
                todo.remove(run)
                failed.add(run.name)
                result["failed"].append(run.name)
                reason = f"waits for {blocked}, which failed or are not part of this invocation"
                ledger.set_status(run, status=FAILED, returncode=None, finished=utc_now(), reason=reason)
                print(f"[sweep] {run.name}: not run, it {reason}", flush=True)
                continue
            if not all(d in finished for d in run.depends_on):
                continue
            key = data_key(run)
            if jobs > 1 and key not in data_ready and shards_ready(run):
                data_ready.add(key)
            if jobs > 1 and key not in data_ready:
                if preparing is not None:
                    continue  # one run at a time may prepare token shards
                preparing = key
            try:
                shared = computed_source(ledger, run, running, finished)
            except SpecError:
                shared = None  # its settings cannot be resolved (a grid without a finite loss): _Launch says why
            if shared == WAIT:
                continue  # a run with the same identity is in flight: this one takes its numbers when it ends
            if shared is not None:
                todo.remove(run)
                ledger.set_status(run, **shared)
                finished.add(run.name)
                result["done"].append(run.name)
                if shared.get("adopted_from"):
                    how = f"adopted from {shared['adopted_from']} (its probe {shared['probe']} reproduced its twin)"
                else:
                    how = f"the same run as {shared.get('same_as') or shared.get('reused_from')}"
                print(f"[sweep] {run.name}: not run, {how} (identity {shared['identity']})")
                continue
            todo.remove(run)
            try:
                running.append(_Launch(ledger, run, threads, restart_changed))
            except (SpecError, RunDirectoryInUse) as err:  # taken by another runner meanwhile, or edited
                failed.add(run.name)
                result["failed"].append(run.name)
                ledger.set_status(run, status=FAILED, returncode=None, finished=utc_now(), reason=str(err))
                print(f"[sweep] {run.name}: not run: {err}", flush=True)
                continue
            launched = True
        progress.maybe_print(todo, running, finished, failed)
        if running and not launched:
            time.sleep(0.5)


# ------------------------------------------------------------------------------------------------------ SLURM
@dataclasses.dataclass(frozen=True)
class SweepOutcome:
    """What `sweep_command` leaves to the command line's `sweep` (cli/main.py, report/after_sweep.py): the claims'
    power plan after a dry run's estimate, or the report after the runs, then the exit status."""

    sweep: Sweep | None = None  # None: nothing follows (--status, --slurm)
    power_plan: bool = False  # a dry run whose estimate was printed: the power plan follows it
    report: bool = False  # the runs ended (not --no-report, not --run): write the report
    failed: tuple[str, ...] = ()  # the runs that failed: the command exits naming them, after the report


def dry_run(sweep: Sweep) -> bool:
    """Print the plan: every run, what would happen to it, and its command; then the estimate. False: the estimate
    was not made (a run's settings do not resolve here)."""
    ledger = Ledger(sweep)
    print(f"{sweep.study} ({sweep.profile} profile): {len(sweep.runs)} runs into {sweep.sweep_dir}")
    missing = sweep.missing_needs()
    if missing:
        print(f"  MISSING (the sweep would stop here): {missing}")
    ledger.threads = run_threads(sweep.jobs)
    for run in sweep.runs:
        try:
            what = ledger.changed(run)
        except SpecError as err:
            what = [str(err)]
        if what is not None:
            action = f"changed since computed ({'; '.join(what)}): refused, or recomputed with --on-changed recompute"
        elif ledger.is_done(run):
            action = "skip (done)"
        elif ledger.last_checkpoint(run):
            action = f"resume from {ledger.last_checkpoint(run)}"
        else:
            action = "start"
        wait = f", after {', '.join(run.depends_on)}" if run.depends_on else ""
        print(f"  {run.name:<40} {action}{wait}")
        print(f"      {shlex.join(['lightning_cqk', 'fit', *run.cli_args(sweep.sweep_dir)])}")
    from lightning_cqk.study.design.cost_estimate import summary_lines

    try:
        print("\n".join(summary_lines(sweep, sweep.jobs)))
    except SpecError as err:  # a run's settings the CLI cannot resolve here (a module it cannot import): said
        print(f"Estimate: not made, a run's settings do not resolve here ({err}).")
        return False
    return True


CONFIRM_MINUTES = 60  # `--confirm` asks before a study estimated longer than this


def confirm_start(sweep: Sweep, jobs: int) -> None:
    """Print the study's estimate; from a terminal, ask before one over CONFIRM_MINUTES (exit when not confirmed)."""
    from lightning_cqk.study.design.cost_estimate import estimate_runs, study_seconds

    runs = estimate_runs(sweep)
    minutes = study_seconds(runs, jobs) / 60
    done = sum(Ledger(sweep).is_done(run) for run in sweep.runs)
    print(
        f"{sweep.study} ({sweep.profile} profile): {len(runs)} runs ({done} done before: skipped), about {minutes:.0f} "
        f"min wall with {jobs} jobs on an idle machine (estimate; --dry-run lists every run).",
        flush=True,
    )
    if minutes <= CONFIRM_MINUTES or not sys.stdin.isatty():
        return
    answer = input("Start it now? [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        sys.exit("lightning_cqk sweep: not started.")


def sweep_command(argv: list[str]) -> SweepOutcome:
    """`lightning_cqk sweep SPEC [--profile cpu] [--dry-run] [--jobs N] [--output DIR] [--slurm] [--run NAME]`."""
    parser = argparse.ArgumentParser(
        prog="lightning_cqk sweep",
        description="Expand an ablation spec (configs/ablations/*.yaml) into runs and run them, resumably.",
    )
    parser.add_argument("spec", help="the spec YAML, e.g. configs/ablations/coupling.yaml")
    parser.add_argument("--profile", default="cpu", help="profile of the spec (default cpu; shipped: also paper)")
    parser.add_argument("--output", default=None, help="sweep directory (default runs/<study>-<profile>)")
    parser.add_argument("--jobs", type=int, default=None, help="runs at a time (default: the profile's jobs, else 1)")
    parser.add_argument("--dry-run", "--dry_run", action="store_true", help="print the runs and commands, run nothing")
    parser.add_argument("--slurm", action="store_true", help="write SLURM array scripts instead of running")
    parser.add_argument(
        "--status",
        action="store_true",
        help="print each run's state and step, and its SLURM task's state (squeue), then exit "
        "(study/run/slurm_status.py)",
    )
    parser.add_argument("--max-parallel", "--max_parallel", type=int, default=None, help="SLURM array %% limit")
    parser.add_argument("--run", action="append", default=None, help="run only this run (repeatable)")
    parser.add_argument(
        "--adopt",
        action="append",
        default=None,
        help="a folder of committed results (or of such folders, e.g. docs/results) whose finished twins of this "
        "sweep's runs are adopted once each arm's lowest seed reproduces its twin to the last digit here (repeatable)",
    )
    parser.add_argument("--no-report", "--no_report", action="store_true", help="do not write the report afterwards")
    parser.add_argument(
        "--confirm",
        action="store_true",
        help=f"print the study's estimated time first and, from a terminal, ask before a study over {CONFIRM_MINUTES} "
        "min (make ablations passes it)",
    )
    parser.add_argument(
        "--start",
        choices=start_mode.START_MODES,
        default=None,
        help="fork (default, Linux): start each run from one worker that imported torch and Lightning once; "
        "fresh: a new python process per run (lightning_cqk/study/run/worker.py)",
    )
    parser.add_argument(
        "--restart-changed",
        "--restart_changed",
        action="store_true",
        help="restart from scratch (deleting their directories) the interrupted runs whose settings were edited "
        "since; without it such runs are refused",
    )
    parser.add_argument(
        "--on-changed",
        "--on_changed",
        choices=ON_CHANGED,
        default="refuse",
        help="a finished run whose identity changed (other code, data, settings, packages, device or threads "
        "than now): refuse (default: nothing starts, what changed is named) or recompute it as a new attempt (its "
        "old directory kept under <sweep dir>/superseded/)",
    )
    args = parser.parse_args(argv)
    start_mode.mode = args.start or start_mode.default_mode()
    previous = {}
    if args.run and threading.current_thread() is threading.main_thread():  # an array task: stops count from here
        previous = {signum: signal.signal(signum, _note_early_stop) for signum in StopSignal.SIGNALS}
    try:
        return _sweep(args)
    finally:
        for signum, handler in previous.items():
            # in a SLURM job a late SIGUSR1 (a time limit's warning while the finished task exits) is ignored: its
            # default action would end the task "User defined signal 1", failed, after its run was recorded done
            late_warning = signum == signal.SIGUSR1 and slurm_job_id() is not None
            signal.signal(signum, signal.SIG_IGN if late_warning else handler)
        _early_stops.clear()


def _sweep(args: argparse.Namespace) -> SweepOutcome:
    """`sweep_command` once its arguments are parsed."""
    try:
        sweep = expand(args.spec, args.profile, args.output)
        if args.jobs is not None and args.jobs < 1:
            raise SpecError(f"--jobs must be at least 1, got {args.jobs}.")
        if args.dry_run:
            return SweepOutcome(sweep, power_plan=dry_run(sweep))
        if args.status:
            from lightning_cqk.study.run.slurm_status import status_lines

            print("\n".join(status_lines(sweep)))
            return SweepOutcome()
        if args.slurm:
            files = write_slurm(sweep, args.spec, args.max_parallel)
            print("Wrote " + ", ".join(str(f) for f in files) + f"\nSubmit with: bash {files[-1]}")
            return SweepOutcome()
        if args.confirm:
            confirm_start(sweep, args.jobs or sweep.jobs)
        result = run_local(
            sweep, args.jobs or sweep.jobs, args.run, args.restart_changed, args.adopt, on_changed=args.on_changed
        )
    except SpecError as err:
        sys.exit(f"lightning_cqk sweep: {err}")
    except KeyboardInterrupt:
        sys.exit(130)
    stopped = f", {len(result['stopped'])} stopped by a signal" if result["stopped"] else ""
    print(
        f"[sweep] {sweep.study}-{sweep.profile}: {len(result['done'])} run, {len(result['skipped'])} skipped (done "
        f"before), {len(result['failed'])} failed{stopped}; manifest {sweep.sweep_dir / MANIFEST}",
        flush=True,
    )
    if result.get("stopped_by"):  # no report of a study that is not finished; the job may already be requeued
        sys.exit(_exit_code(result["stopped_by"][0]))
    return SweepOutcome(sweep, report=not args.no_report and not args.run, failed=tuple(result["failed"]))
