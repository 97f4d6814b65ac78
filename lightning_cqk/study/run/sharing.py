"""No run computed twice, at launch (issue 31), and never another run's numbers (issue 43): a run whose identity
(study/run/identity.py: settings, seed, code, data, packages, device, precision, threads) equals a finished run's of
this
sweep, or of a sibling sweep beside it, takes that run's numbers instead of running; a run whose settings and data
equal a committed twin's takes the twin's once its arm's probe reproduced its own twin to the last digit here
(study/run/adopt.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from lightning_cqk.study.design.spec import Run
from lightning_cqk.study.run.adopt import reproduces
from lightning_cqk.study.run.identity import identity_digest
from lightning_cqk.study.run.ledger import DONE, FAILED, Ledger, utc_now


class InFlight(Protocol):
    """A run being computed now (the runner's launch of it)."""

    run: Run


WAIT = "wait"
SHARED = ("same_as", "reused_from", "adopted_from")


def device_of(run_dir: Path) -> str:
    """The device the run's last attempt computed on (its run.json), else "unrecorded"."""
    from lightning_cqk.run.directory import read_record

    record = read_record(run_dir) or {}
    attempts = record.get("attempts") or [{}]
    return attempts[-1].get("device") or "unrecorded"


def computed_source(
    ledger: Ledger, run: Run, running: list[InFlight], finished: set[str]
) -> dict[str, Any] | str | None:
    """Whether `run` need not be computed: WAIT while a run of this sweep with the same identity is in flight (the
    same data folders: `Ledger.launch_key`); the
    status fields that make it share a finished run of the same identity (of this sweep: `same_as`; of a sibling
    sweep beside it: `reused_from`) or adopt a committed twin (`adopted_from`); None when it must run."""
    key = ledger.launch_key(run)
    if any(ledger.status(x.run).get("launch_key") == key for x in running):
        return WAIT
    fields = ledger.identity_fields(run)
    identity = fields["identity"]
    base = {"status": DONE, **fields, "config_hash": run.config_hash(), "finished": utc_now(), "returncode": 0}
    for other in ledger.sweep.runs:
        status = ledger.status(other)
        if other.name != run.name and other.name in finished and status.get("identity") == identity:
            if not any(status.get(k) for k in SHARED):
                return {**base, "same_as": other.name, **_provenance(status)}
    source = _sibling_run(ledger, identity)
    if source is not None:
        return {**base, "reused_from": str(source["dir"]), **_provenance(source["status"])}
    return _adoption(ledger, run, running, finished, base)


def _provenance(status: dict[str, Any]) -> dict[str, Any]:
    """What computed a shared run's numbers, from the run that computed them."""
    return {k: status[k] for k in ("device", "revisions", "packages") if status.get(k) is not None}


def _adoption(
    ledger: Ledger, run: Run, running: list[InFlight], finished: set[str], base: dict[str, Any]
) -> dict[str, Any] | str | None:
    """A committed twin's numbers for `run` once its arm's probe (the lowest seed with a twin) reproduced its own twin
    to the last digit here and both twins were computed the same way (study/run/adopt.py); WAIT while the probe has not
    finished; None when `run` is the probe, has no twin, or the probe did not reproduce."""
    twin = ledger.committed.get(ledger.identity(run).what())
    if twin is None:
        return None
    probe = next((r for r in _arm(ledger, run) if ledger.identity(r).what() in ledger.committed), None)
    if probe is None or probe.name == run.name:
        return None
    if probe.name not in finished:
        return WAIT if ledger.status(probe).get("status") != FAILED else None
    probe_twin = ledger.committed[ledger.identity(probe).what()]
    if not reproduces(ledger.result_dir(probe), probe_twin):
        ledger.set_status(probe, reproduces=False, twin=probe_twin.source)
        return None
    ledger.set_status(probe, reproduces=True, twin=probe_twin.source)
    if twin.how != probe_twin.how:  # other code, packages, device or threads made it: the probe vouches for neither
        print(
            f"[sweep] {run.name}: not adopted from {twin.source}: it was computed otherwise than {probe_twin.source}, "
            f"which {probe.name} reproduced",
            flush=True,
        )
        return None
    made_by = twin.made_by  # the code, device and threads that made its numbers: the twin's, through any chain
    provenance = {"revisions": list(twin.revisions), "device": made_by.get("device"), "made_by": made_by}
    return {**base, "adopted_from": twin.source, "probe": probe.name, **provenance}


def _arm(ledger: Ledger, run: Run) -> list[Run]:
    """The runs of `run`'s group, by seed."""
    return sorted((r for r in ledger.sweep.runs if r.group == run.group), key=lambda r: r.seed)


def _sibling_run(ledger: Ledger, identity: str) -> dict[str, Any] | None:
    """A finished run with `identity` (its record consistent: the identity is its parts' sha256) in another sweep
    directory beside this one, computed there from scratch (not shared, adopted or resumed): its numbers are this
    run's to the last digit."""
    parent = ledger.dir.parent
    for status_file in sorted(parent.glob("*/status/*.json")):
        sweep_dir = status_file.parent.parent
        if sweep_dir.resolve() == ledger.dir.resolve():
            continue
        try:
            status = json.loads(status_file.read_text())
        except (OSError, ValueError):
            continue
        if status.get("status") != DONE or status.get("identity") != identity or any(status.get(k) for k in SHARED):
            continue
        if status.get("resumed_from") or identity_digest(status.get("identity_parts") or {}) != identity:
            continue
        run_dir = sweep_dir / status_file.stem
        if (run_dir / "budget.json").is_file():
            return {"dir": run_dir.resolve(), "status": status}
    return None
