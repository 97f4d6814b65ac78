"""Adopting committed runs: a run whose twin is in a folder of committed results is not computed again, where that is
safe (issue 31 item 2, issue 43).

`lightning_cqk sweep SPEC --profile cpu --adopt docs/results` indexes the finished runs of every committed study
(`docs/results/<study>/study.json` and `runs.csv`: lightning_cqk/study/report/results.py) by the identity each one
recorded
when it was computed (study/run/identity.py), never by one rebuilt from today's config files: a twin is a committed run
whose recorded settings and data equal this run's (`Identity.what`). Before anything starts, every committed run's
record is checked (`check_record`): its identity must be the sha256 of its parts, its `settings` part the sha256 of
its stored resolved settings, its stored overrides, seed and learning rate those settings' values, and runs.csv's
identity study.json's; a run that disagrees is refused by name (a swapped or hand-edited record). A run committed
before identities were recorded, or one that was resumed, is not adopted (said once per folder).

Runs are deterministic on one CPU type but not across types (the corpus study's `wikitext-standard-s1`: val ppl
7.8167 where it was committed, 7.7688 from the same command, revision and packages on another CPU), and other code
may give other numbers, so nothing is adopted on trust:

- in each arm (a group of the sweep) whose runs have committed twins, the lowest such seed is the *probe*: it runs;
- when its final validation loss and perplexity equal its twin's to the last digit, this machine and code reproduce
  the committed numbers, and the arm's other runs whose twins were computed the same way as the probe's twin (the
  same code, packages, device, precision and threads: `how_of`) are adopted (status `adopted_from:
  <folder>#<run>`; the report reads their numbers from the committed files and names them). Their provenance
  (revisions, device, threads: `made_by`) is the twin's, and a committed run that was itself adopted passes on its
  own twin's, so it survives chains of adoption;
- when they differ, the arm's runs are all computed here, and the report says the committed ones did not reproduce.

A run that waits for another (`budget.match_to`) is never adopted: its committed overrides name the other run's
directory in the sweep that made it. A run that waits only for its learning-rate grid is (its rate is in runs.csv).
"""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path
from typing import Any

from lightning_cqk.study.run.identity import (
    INERT_KEYS,
    Identity,
    canonical_key,
    flatten,
    how_of,
    identity_digest,
    is_data_path,
    same_value,
    settings_digest,
)


@dataclasses.dataclass(frozen=True)
class CommittedRun:
    """A finished run of a folder of committed results, as its record says it was computed."""

    folder: Path
    name: str
    what: str  # Identity.what of its recorded identity: its settings and data
    val_loss: float
    val_ppl: float
    revisions: tuple[str, ...] = ()  # the code revisions its numbers were computed by (runs.csv `code_revision`)
    made_by: dict[str, Any] = dataclasses.field(default_factory=dict)  # how_of: code, packages, device, threads

    @property
    def source(self) -> str:
        return f"{self.folder}#{self.name}"

    @property
    def how(self) -> str:
        import json

        return json.dumps(self.made_by, sort_keys=True, default=str)


def committed_folders(paths: list[str | Path]) -> list[Path]:
    """The folders of committed results that `--adopt` names: each path is one (study.json and runs.csv in it) or
    holds some (docs/results). Raises FileNotFoundError naming a path that is neither."""
    from lightning_cqk.study.report.results import is_committed

    out: list[Path] = []
    for path in map(Path, paths):
        if is_committed(path):
            out.append(path)
            continue
        found = sorted(p for p in path.iterdir() if is_committed(p)) if path.is_dir() else []
        if not found:
            raise FileNotFoundError(
                f"--adopt {path}: no committed results there (a folder with study.json and runs.csv, or a folder of "
                "such folders, e.g. --adopt docs/results)"
            )
        out.extend(found)
    return out


def index_committed(folders: list[Path], notes: list[str] | None = None) -> dict[str, CommittedRun]:
    """{what a run is (`Identity.what`): the committed finished run} of the folders (the first folder's where two
    hold one). Raises ValueError naming a run whose record disagrees with itself (`check_record`); `notes` gets a
    line per folder whose runs cannot be adopted (no recorded identity, or resumed)."""
    from lightning_cqk.study.design.tuned_rate import all_grid_runs
    from lightning_cqk.study.report.results import RUNS_FILE, read_committed

    index: dict[str, CommittedRun] = {}
    for folder in folders:
        manifest, finished, _ = read_committed(folder)  # cross-checked: a tampered folder is refused by name
        with open(folder / RUNS_FILE, newline="") as handle:
            rows = {row["run"]: row for row in csv.DictReader(handle)}
        grid = all_grid_runs(manifest.get("spec", {}).get("tuning"))  # a tuned run waits for its grid only for
        unrecorded, resumed = [], []
        for run in manifest.get("runs", []):  # its rate, which runs.csv records: it may be adopted
            name = run["name"]
            if name not in finished or set(run.get("depends_on") or []) - grid:
                continue
            if not run.get("identity_parts"):
                unrecorded.append(name)
                continue
            row = rows[name]
            check_record(folder, run, row)
            if run.get("resumed_from"):
                resumed.append(name)
                continue
            parts = run["identity_parts"]
            made_by = run.get("made_by") or how_of(parts)
            revisions = tuple(str(row.get("code_revision") or "").split())
            what = Identity(parts).what()
            twin = CommittedRun(folder, name, what, float(row["val_loss"]), float(row["val_ppl"]), revisions, made_by)
            index.setdefault(what, twin)
        if notes is not None and unrecorded:
            notes.append(
                f"{folder}: {len(unrecorded)} finished runs have no recorded identity (committed before identities "
                "were recorded): not adopted"
            )
        if notes is not None and resumed:
            notes.append(f"{folder}: {', '.join(resumed)} were resumed from a checkpoint: not adopted")
    return index


def check_record(folder: Path, run: dict[str, Any], row: dict[str, str]) -> None:
    """Refuse (ValueError, by name) a committed run whose stored identity disagrees with its stored settings: its
    identity is not its parts' sha256, its `settings` part is not its resolved settings' sha256, its overrides,
    seed or learning rate are not those settings' values, or runs.csv gives another identity."""
    name = f"{folder}#{run['name']}"
    parts, settings = run.get("identity_parts") or {}, run.get("resolved_settings")
    problems = []
    if run.get("identity") != identity_digest(parts):
        problems.append("its identity is not the sha256 of its identity parts")
    if (row.get("identity") or "") != run.get("identity"):
        problems.append("runs.csv gives it another identity than study.json")
    if not isinstance(settings, dict) or settings_digest(settings) != parts.get("settings"):
        problems.append("its identity's settings part is not the sha256 of its stored resolved settings")
        settings = settings if isinstance(settings, dict) else {}
    if settings.get("seed_everything") != run.get("seed"):
        problems.append(f"its seed is {run.get('seed')}, its settings' {settings.get('seed_everything')}")
    overrides = _with_committed_rate(dict(run.get("overrides") or {}), row)
    for key, value in overrides.items():
        flat = flatten(value, canonical_key(key)) if isinstance(value, dict) and value else {canonical_key(key): value}
        for k, v in flat.items():
            if any(k == i or k.startswith(i + ".") for i in INERT_KEYS) or is_data_path(k) or k == "budget.match_to":
                continue  # where it wrote; its data are in the identity's data part, by content
            if k not in settings or not same_value(settings[k], v):
                problems.append(f"its override {k}={v!r} is not its settings' {settings.get(k, '(absent)')!r}")
    lr = row.get("lr")
    if lr not in (None, "") and not same_value(float(lr), settings.get("model.optim.lr")):
        problems.append(f"runs.csv's lr {lr} is not its settings' {settings.get('model.optim.lr')!r}")
    if problems:
        raise ValueError(
            f"committed run {name}: its record disagrees with itself ({'; '.join(problems)}). A hand-edited or "
            "swapped record would adopt another run's numbers under this run's name: put back what the report "
            "wrote (git checkout the folder), or adopt without this folder."
        )


def _with_committed_rate(overrides: dict[str, Any], row: dict[str, str]) -> dict[str, Any]:
    """A grid-chosen rate ("{tuned_lr:...}") replaced by the rate the committed run trained at (runs.csv `lr`)."""
    rate = overrides.get("model.optim.lr")
    from lightning_cqk.study.design.tuned_rate import is_tuned_rate

    if is_tuned_rate(rate):
        lr = float(row.get("lr") or "nan")
        if math.isfinite(lr):
            overrides["model.optim.lr"] = lr
    return overrides


def reproduces(run_dir: Path, twin: CommittedRun) -> bool:
    """Whether the run in `run_dir` ended at its twin's final validation loss and perplexity, to the last digit."""
    from lightning_cqk.study.run.run_scalars import read_scalars

    scalars = read_scalars(run_dir, {"val/loss", "val/ppl"})
    if not scalars.get("val/loss") or not scalars.get("val/ppl"):
        return False
    loss, ppl = float(scalars["val/loss"][-1][1]), float(scalars["val/ppl"][-1][1])
    if not all(math.isfinite(x) for x in (loss, ppl, twin.val_loss, twin.val_ppl)):
        return False  # a diverged run vouches for nothing: its arm is computed here
    return repr(loss) == repr(twin.val_loss) and repr(ppl) == repr(twin.val_ppl)
