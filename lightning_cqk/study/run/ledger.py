"""A sweep's bookkeeping (lightning_cqk/study/run/runner.py runs it): per run its status file, directory, identity and
whether it is done or may resume, the code revisions and package versions its attempts ran with, and manifest.json
rebuilt from the status files."""

from __future__ import annotations

import datetime as _dt
import json
import shlex
from pathlib import Path
from typing import Any

from lightning_cqk.files.atomic import write_json_atomically
from lightning_cqk.run.directory import resumable_checkpoint
from lightning_cqk.run.lock import LOCK_NAME, LockOwner, holder
from lightning_cqk.run.version_records import code_revision, describe_difference, git_revision, package_versions
from lightning_cqk.study.design.spec import Run, SpecError, Sweep
from lightning_cqk.study.design.spec_checks import owned_run_dir
from lightning_cqk.study.run.adopt import CommittedRun
from lightning_cqk.study.run.identity import (
    Identity,
    changes,
    identity_of,
    replace_run_paths,
    resolved_flat,
    result_dir,
)


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


MANIFEST = "manifest.json"
SWEEP_LOCK = ".sweep.lock"  # held by a whole-sweep invocation for its life (runner.run_local)
DONE, RUNNING, FAILED, PENDING = "done", "running", "failed", "pending"
# A run a stop signal ended after its save (runner.StopSignal): "requeued" when its SLURM job was requeued for it,
# "stopped" otherwise (a SIGTERM: scancel, a preemption, `timeout`; a SIGUSR1 outside SLURM). Either resumes from
# its checkpoint at the next attempt, like an interrupted run.
REQUEUED, STOPPED = "requeued", "stopped"
# What a sweep does with a finished run whose recorded identity differs from the one computed now (other code, data,
# settings, packages, device or threads made its numbers): `refuse` (default: nothing starts, the changes are named)
# or `recompute` (a new attempt; the old directory is kept under <sweep dir>/superseded/).
ON_CHANGED = ("refuse", "recompute")
SUPERSEDED = "superseded"


def stop_advice(owner: LockOwner, lock: Path) -> str:
    """How to end the process that holds `lock`, as a clause: `stop it (kill PID)` only for a process of this host.

    A pid on another host means nothing here (and a lock file on a shared file system may outlive its run there),
    so the advice is the run lock's: delete the file if that process is finished or dead. A holder that has not
    written its name yet (pid -1) is only waited for: `kill -1` would signal every process of the user.
    """
    if owner.pid < 0:
        return "wait a few seconds for it (it is starting and has not written its name yet)"
    if owner.alive() is None:
        return (
            f"it runs on host {owner.host}, which cannot be checked from here: if it is finished or dead, delete "
            f"its lock file (rm {shlex.quote(str(lock))}); otherwise wait for it"
        )
    return f"wait for it to end, or stop it (kill {owner.pid})"


def _versions() -> dict[str, str | None]:
    """Python, this package and every direct dependency (run/version_records.py), as each run's attempts record them."""
    return package_versions()


class Ledger:
    """The state of a sweep directory: per-run status files and the manifest built from them."""

    def __init__(self, sweep: Sweep) -> None:
        self.sweep = sweep
        self.dir = sweep.sweep_dir
        self.status_dir = self.dir / "status"
        self.log_dir = self.dir / "logs"
        self._revision: str | None = None
        self.committed: dict[
            str, CommittedRun
        ] = {}  # what a run is -> a committed twin (`--adopt`, study/run/adopt.py)
        self._settings: dict[str, dict[str, Any]] = {}  # run name -> its resolved settings, once they can be computed
        self.threads: int | None = None  # the runner's OMP_NUM_THREADS for its runs (--jobs > 1), else None
        self.on_changed = "refuse"  # ON_CHANGED

    def code_revision(self) -> str:
        """The code this sweep invocation runs, as recorded per attempt: the commit, '-dirty' when tracked files
        have uncommitted changes, 'unknown' outside a git checkout (the package version is in the manifest)."""
        if self._revision is None:
            self._revision = code_revision()
        return self._revision

    def mixed_revisions(self, runs: list[Run]) -> str | None:
        """A note when finished runs were made by other code than this invocation runs, else None."""
        now = self.code_revision()
        other: dict[str, int] = {}
        for run in runs:
            for rev in self.status(run).get("revisions", []):
                if rev != now:
                    other[rev] = other.get(rev, 0) + 1
        if not other:
            return None
        listed = ", ".join(f"{rev[:12]} ({n} runs)" for rev, n in sorted(other.items()))
        return (
            f"runs done before were made by other code ({listed}) than this invocation runs ({now[:12]}). They are "
            "kept: the report lists each run's revision. For one revision throughout, sweep into a new directory "
            "with --output."
        )

    def mixed_packages(self, runs: list[Run]) -> str | None:
        """A note when finished runs ran with other package versions than this invocation has, else None."""
        now = package_versions()
        other: dict[str, int] = {}
        for run in runs:
            for versions in self.status(run).get("packages", []):
                change = describe_difference(versions, now)
                if change:
                    other[change] = other.get(change, 0) + 1
        if not other:
            return None
        listed = "; ".join(f"{change} ({n} runs)" for change, n in sorted(other.items()))
        return (
            f"runs done before ran with other package versions than this invocation has: {listed}. They are kept: "
            "each run's status file and run.json list the versions of each attempt. For one environment "
            "throughout, sweep into a new directory with --output (or install the versions they ran with)."
        )

    def status(self, run: Run) -> dict[str, Any]:
        path = self.status_dir / f"{run.name}.json"
        return json.loads(path.read_text()) if path.is_file() else {"status": PENDING, "attempts": 0}

    def set_status(self, run: Run, **fields: Any) -> dict[str, Any]:
        status = {**self.status(run), **fields}
        write_json_atomically(self.status_dir / f"{run.name}.json", status)
        return status

    def run_dir(self, run: Run) -> Path:
        return owned_run_dir(self.dir, run.name)  # never outside the sweep directory (the runner deletes in it)

    def result_dir(self, run: Run) -> Path:
        """Where the run's numbers are: its own directory, or the run it shares (`same_as`, a run of this sweep with
        the same identity; `reused_from`, a finished run of a sibling sweep)."""
        if self.status(run).get("same_as"):
            owned_run_dir(self.dir, self.status(run)["same_as"])  # a plain name inside the sweep, or refused
        return result_dir(self.dir, run.name)

    def resolved(self, run: Run) -> dict[str, Any]:
        """The run's configuration as `lightning_cqk fit` resolves it (cli/resolve.py), flattened, as it would be
        launched now (a tuned rate filled in), with the paths of this sweep's other runs (`budget.match_to`) replaced
        by their identities. Raises SpecError when a grid has not chosen yet or the parser refuses it."""
        from lightning_cqk.study.design.settings import ConfigUnresolvable
        from lightning_cqk.study.run.tuned_overrides import resolve_overrides

        if run.name not in self._settings:
            overrides = resolve_overrides(run.overrides, self.sweep.spec, self.sweep.sweep_dir)  # raises before grid
            others = {r.name: self.identity(r).digest for r in self.sweep.runs if r.name in run.depends_on}
            overrides = replace_run_paths(overrides, self.sweep.sweep_dir, others)
            try:
                # stable from here on within one invocation (the grid it reads has finished; a run it names, too)
                self._settings[run.name] = resolved_flat(run.configs, overrides, run.seed)
            except ConfigUnresolvable as err:
                raise SpecError(f"run {run.name}: {err}") from None
        return self._settings[run.name]

    def identity(self, run: Run) -> Identity:
        """The run's identity now (study/run/identity.py): its resolved settings, this invocation's code, packages,
        device
        and thread count, and its data as they are on disk now (a folder its first run prepares changes from "not
        prepared" to its content)."""
        return identity_of(self.resolved(run), self.threads)[0]

    def launch_key(self, run: Run) -> str:
        """What a run in flight is matched by: its identity with the data part replaced by the data folders it reads
        (a folder its first run is preparing has no content fingerprint yet; two runs of one folder read the same)."""
        from lightning_cqk.study.run.identity import data_dirs, identity_digest

        flat = self.resolved(run)
        parts = identity_of(flat, self.threads)[0].parts
        return identity_digest({**parts, "data": data_dirs(flat)})

    def identity_fields(self, run: Run) -> dict[str, Any]:
        """The status fields that record the run's identity now: `identity`, `identity_parts`, `resolved_settings`."""
        identity, settings = identity_of(self.resolved(run), self.threads)
        return {"identity": identity.digest, "identity_parts": identity.parts, "resolved_settings": settings}

    def changed(self, run: Run) -> list[str] | None:
        """What differs between a finished run's recorded identity and the one computed now (`identity.changes`), or
        None when it is not finished or nothing differs."""
        status = self.status(run)
        if status.get("status") != DONE:
            return None
        now = self.identity(run)
        if status.get("identity") == now.digest:
            return None
        return changes(status.get("identity_parts"), now.parts)

    def is_done(self, run: Run) -> bool:
        """Finished, with its numbers on disk, and computed by what this invocation would compute it with (its
        recorded identity equals the one computed now). A finished run of another identity is refused (SpecError
        naming what changed) unless `on_changed` is recompute: then it is not done, and `supersede` sets it aside."""
        status = self.status(run)
        adopted = status.get("adopted_from")  # numbers in committed results (study/run/adopt.py)
        where = Path(str(adopted).split("#")[0]) / "runs.csv" if adopted else self.result_dir(run) / "budget.json"
        if status.get("status") != DONE or not where.is_file():
            return False
        what = self.changed(run)
        if what is None:
            return True
        if self.on_changed == "recompute":
            return False
        raise SpecError(self.changed_message(run, what))

    def changed_message(self, run: Run, what: list[str]) -> str:
        return (
            f"{self.dir}: run {run.name} was computed by other code, data or settings than this invocation would "
            f"compute it with ({'; '.join(what)}). Its numbers would be reported as this code's. To compute the "
            "changed runs again as new attempts (their old directories are kept under "
            f"{self.dir / SUPERSEDED}), add --on-changed recompute; or sweep into a new directory with --output."
        )

    def supersede(self, run: Run) -> None:
        """Set a finished run of another identity aside before it is computed again: its directory moves to
        <sweep dir>/superseded/<run>-<attempts>/ (kept, never deleted) and its status becomes pending, its earlier
        identity listed under `superseded`."""
        status = self.status(run)
        entry = {"identity": status.get("identity"), "finished": status.get("finished")}
        for key in ("same_as", "reused_from", "adopted_from"):
            if status.get(key):
                entry[key] = status[key]
        own = self.run_dir(run)
        if own.exists() and not any(status.get(k) for k in ("same_as", "reused_from", "adopted_from")):
            target = self.dir / SUPERSEDED / f"{run.name}-{status.get('attempts', 0)}"
            n = 1
            while target.exists():
                n += 1
                target = self.dir / SUPERSEDED / f"{run.name}-{status.get('attempts', 0)}.{n}"
            target.parent.mkdir(parents=True, exist_ok=True)
            own.rename(target)
            entry["dir"] = str(target)
        kept = {"attempts": status.get("attempts", 0)}  # the revisions and packages of its numbers start again
        path = self.status_dir / f"{run.name}.json"
        write_json_atomically(path, {**kept, "status": PENDING, "superseded": [*status.get("superseded", []), entry]})

    def last_checkpoint(self, run: Run) -> Path | None:
        """The checkpoint to resume `run` from: last.ckpt, else the newest intact step=*.ckpt (run/directory.py)."""
        return resumable_checkpoint(self.run_dir(run))[0]

    def problems(self, run: Run) -> str | None:
        """Why `run` must not be started or resumed now: a live writer in its directory, or a spec edited since
        its interrupted attempt began (its checkpoint holds the old settings). None when it may go."""
        owner = holder(self.run_dir(run))
        if owner is not None:
            advice = stop_advice(owner, self.run_dir(run) / LOCK_NAME)
            return (
                f"{self.run_dir(run)} is still being written by pid {owner.pid} ({owner.describe()}), e.g. a run "
                f"left running by a sweep that was killed: {advice}; then run the sweep again, and its checkpoint "
                "is resumed."
            )
        status = self.status(run)
        recorded = status.get("config_hash")
        if status.get("status") != DONE and recorded and recorded != run.config_hash() and self.run_dir(run).exists():
            return (
                f"run {run.name} was interrupted with config hash {recorded}, but the spec and config files now give "
                f"{run.config_hash()} (something was edited since). Resuming its checkpoint under the new settings "
                "would mix two experiments in one run: restore the spec, sweep into a new directory with --output, "
                f"or pass --restart-changed to delete {self.run_dir(run)} and run it again from scratch."
            )
        return None

    def write_manifest(self) -> dict[str, Any]:
        sweep = self.sweep
        path = self.dir / MANIFEST
        previous = json.loads(path.read_text()) if path.is_file() else {}
        runs = []
        for run in sweep.runs:
            runs.append(
                {
                    "name": run.name,
                    "group": run.group,
                    "seed": run.seed,
                    "levels": run.levels,
                    "configs": run.configs,
                    "overrides": run.overrides,
                    "depends_on": run.depends_on,
                    "config_hash": run.config_hash(),
                    "command": shlex.join(["lightning_cqk", "fit", *run.cli_args(sweep.sweep_dir)]),
                    **self.status(run),
                }
            )
        manifest = {
            "study": sweep.study,
            "profile": sweep.profile,
            "spec_path": sweep.spec_path,
            "created": previous.get("created", utc_now()),
            "updated": utc_now(),
            "git": git_revision(),
            "versions": _versions(),
            "spec": sweep.spec,
            "runs": runs,
        }
        write_json_atomically(path, manifest)
        return manifest


def live_owner(sweep_dir: str | Path) -> LockOwner | None:
    """The process running the sweep in `sweep_dir` now (a whole sweep's `.sweep.lock`, else an array task's
    `status/<run>.lock`), or None when none runs there. A lock of another host counts as live (it cannot be checked)."""
    sweep_dir = Path(sweep_dir)
    owner = holder(sweep_dir, SWEEP_LOCK)
    status = sweep_dir / "status"
    for lock in sorted(status.glob("*.lock")) if owner is None and status.is_dir() else []:
        owner = holder(status, lock.name)
        if owner is not None:
            break
    return owner
