"""Adopting committed runs: a run whose twin is in a folder of committed results is not computed again, where that is
safe (issue 31 item 2).

`lightning_cqk sweep SPEC --profile cpu --adopt docs/results` indexes the finished runs of every committed study
(`docs/results/<study>/study.json` and `runs.csv`: lightning_cqk/sweep/results.py) by identity (sweep/identity.py:
the resolved training configuration and seed, a grid-chosen learning rate filled in from `runs.csv`). Runs are
deterministic on one CPU type but not across types (the corpus study's `wikitext-standard-s1`: val ppl 7.8167 where
it was committed, 7.7688 from the same command, revision and packages on another CPU), so nothing is adopted on
trust:

- in each arm (a group of the sweep) whose runs have committed twins, the lowest such seed is the *probe*: it runs;
- when its final validation loss and perplexity equal its twin's to the last digit, this machine reproduces the
  committed numbers, and the arm's other runs with twins are adopted (status `adopted_from: <folder>#<run>`; the
  report reads their numbers from the committed files and names them);
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

from lightning_cqk.sweep.identity import run_identity


@dataclasses.dataclass(frozen=True)
class CommittedRun:
    """A finished run of a folder of committed results."""

    folder: Path
    name: str
    identity: str
    val_loss: float
    val_ppl: float
    revisions: tuple[str, ...] = ()  # the code revisions its attempts ran (runs.csv `code_revision`)

    @property
    def source(self) -> str:
        return f"{self.folder}#{self.name}"


def committed_folders(paths: list[str | Path]) -> list[Path]:
    """The folders of committed results that `--adopt` names: each path is one (study.json and runs.csv in it) or
    holds some (docs/results). Raises FileNotFoundError naming a path that is neither."""
    from lightning_cqk.sweep.results import is_committed

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


def index_committed(folders: list[Path]) -> dict[str, CommittedRun]:
    """{identity: the committed finished run} of the folders (the first folder's run where two hold one identity)."""
    from lightning_cqk.sweep.results import RUNS_FILE, read_committed
    from lightning_cqk.sweep.tuning import all_grid_runs

    index: dict[str, CommittedRun] = {}
    for folder in folders:
        manifest, finished, _ = read_committed(folder)  # cross-checked: a tampered folder is refused by name
        with open(folder / RUNS_FILE, newline="") as handle:
            rows = {row["run"]: row for row in csv.DictReader(handle)}
        grid = all_grid_runs(manifest.get("spec", {}).get("tuning"))  # a tuned run waits for its grid only for
        for run in manifest.get("runs", []):  # its rate, which runs.csv records: it may be adopted
            name = run["name"]
            if name not in finished or set(run.get("depends_on") or []) - grid:
                continue
            overrides = _with_committed_rate(dict(run.get("overrides") or {}), rows[name])
            identity = run_identity(list(run.get("configs") or []), overrides, int(run["seed"]))
            row = rows[name]
            revisions = tuple(str(row.get("code_revision") or "").split())
            twin = CommittedRun(folder, name, identity, float(row["val_loss"]), float(row["val_ppl"]), revisions)
            index.setdefault(identity, twin)
    return index


def _with_committed_rate(overrides: dict[str, Any], row: dict[str, str]) -> dict[str, Any]:
    """A grid-chosen rate ("{tuned_lr:...}") replaced by the rate the committed run trained at (runs.csv `lr`)."""
    rate = overrides.get("model.optim.lr")
    from lightning_cqk.sweep.tuning import is_tuned_rate

    if is_tuned_rate(rate):
        lr = float(row.get("lr") or "nan")
        if math.isfinite(lr):
            overrides["model.optim.lr"] = lr
    return overrides


def reproduces(run_dir: Path, twin: CommittedRun) -> bool:
    """Whether the run in `run_dir` ended at its twin's final validation loss and perplexity, to the last digit."""
    from lightning_cqk.sweep.report_read import read_scalars

    scalars = read_scalars(run_dir, {"val/loss", "val/ppl"})
    if not scalars.get("val/loss") or not scalars.get("val/ppl"):
        return False
    loss, ppl = float(scalars["val/loss"][-1][1]), float(scalars["val/ppl"][-1][1])
    if not all(math.isfinite(x) for x in (loss, ppl, twin.val_loss, twin.val_ppl)):
        return False  # a diverged run vouches for nothing: its arm is computed here
    return repr(loss) == repr(twin.val_loss) and repr(ppl) == repr(twin.val_ppl)
