"""No run computed twice, at launch (issue 31): a run whose identity (sweep/identity.py) matches a finished run of this
sweep, of a sibling sweep made by the same code on the same device, or a committed twin whose arm's probe reproduced
it to the last digit (sweep/adopt.py) takes that run's numbers instead of running."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from lightning_cqk.device_info import cpu_model
from lightning_cqk.package_versions import package_versions
from lightning_cqk.sweep.adopt import reproduces
from lightning_cqk.sweep.ledger import DONE, FAILED, Ledger, utc_now
from lightning_cqk.sweep.spec import Run


class InFlight(Protocol):
    """A run being computed now (the runner's launch of it)."""

    run: Run


WAIT = "wait"


def device_of(run_dir: Path) -> str:
    """The device the run's last attempt computed on (its run.json), else this machine's CPU."""
    from lightning_cqk.run_dir import read_record

    record = read_record(run_dir) or {}
    attempts = record.get("attempts") or [{}]
    return attempts[-1].get("device") or "unrecorded"  # never reused by another sweep (_sibling_run)


def computed_source(
    ledger: Ledger, run: Run, running: list[InFlight], finished: set[str]
) -> dict[str, Any] | str | None:
    """Whether `run` need not be computed (issue 31: no run computed twice): WAIT while a run of this sweep with the
    same identity is in flight; the status fields that make it share a finished run of the same identity (of this
    sweep: `same_as`; of a sibling sweep beside it, made by the same code revision and packages on this machine's
    device: `reused_from`); None when it must run."""
    identity = ledger.identity(run)
    if any(ledger.status(x.run).get("identity") == identity for x in running):
        return WAIT
    base = {"status": DONE, "identity": identity, "config_hash": run.config_hash(), "finished": utc_now()}
    for other in ledger.sweep.runs:
        status = ledger.status(other)
        if other.name != run.name and other.name in finished and status.get("identity") == identity:
            if not status.get("same_as") and not status.get("reused_from"):
                return {**base, "same_as": other.name, "device": status.get("device"), "returncode": 0}
    source = _sibling_run(ledger, identity)
    if source is not None:
        return {**base, "reused_from": str(source["dir"]), "device": source["device"], "returncode": 0}
    return _adoption(ledger, run, identity, running, finished, base)


def _adoption(
    ledger: Ledger, run: Run, identity: str, running: list[InFlight], finished: set[str], base: dict[str, Any]
) -> dict[str, Any] | str | None:
    """A committed twin's numbers for `run` once its arm's probe (the lowest seed with a twin) reproduced its own twin
    to the last digit here (sweep/adopt.py); WAIT while the probe has not finished; None when `run` is the probe,
    has no twin, or the probe did not reproduce."""
    twin = ledger.committed.get(identity)
    if twin is None:
        return None
    probe = next((r for r in _arm(ledger, run) if ledger.identity(r) in ledger.committed), None)
    if probe is None or probe.name == run.name:
        return None
    if probe.name not in finished:
        return WAIT if ledger.status(probe).get("status") != FAILED else None
    probe_twin = ledger.committed[ledger.identity(probe)]
    if not reproduces(ledger.result_dir(probe), probe_twin):
        ledger.set_status(probe, reproduces=False, twin=probe_twin.source)
        return None
    ledger.set_status(probe, reproduces=True, twin=probe_twin.source)
    device = ledger.status(probe).get("device")  # the twin's numbers are the probe's machine's numbers
    made_by = {"revisions": list(twin.revisions)} if twin.revisions else {}  # the code that made its numbers
    return {**base, "adopted_from": twin.source, "probe": probe.name, "device": device, "returncode": 0, **made_by}


def _arm(ledger: Ledger, run: Run) -> list[Run]:
    """The runs of `run`'s group, by seed."""
    return sorted((r for r in ledger.sweep.runs if r.group == run.group), key=lambda r: r.seed)


def _sibling_run(ledger: Ledger, identity: str) -> dict[str, Any] | None:
    """A finished run with `identity` in another sweep directory beside this one, made by this invocation's code
    revision (not dirty), package versions and device: its numbers are this run's to the last digit."""
    revision = ledger.code_revision()
    if revision == "unknown" or revision.endswith("-dirty"):
        return None  # uncommitted code: its numbers cannot be vouched for by a revision
    device, packages = cpu_model(), package_versions()
    parent = ledger.dir.parent
    for status_file in sorted(parent.glob("*/status/*.json")):
        sweep_dir = status_file.parent.parent
        if sweep_dir.resolve() == ledger.dir.resolve():
            continue
        try:
            status = json.loads(status_file.read_text())
        except (OSError, ValueError):
            continue
        if status.get("status") != DONE or status.get("identity") != identity or status.get("same_as"):
            continue
        if status.get("reused_from") or status.get("revisions") != [revision] or status.get("device") != device:
            continue
        if status.get("packages") != [packages]:
            continue
        run_dir = sweep_dir / status_file.stem
        if (run_dir / "budget.json").is_file():
            return {"dir": run_dir.resolve(), "device": device}
    return None
