"""Recomputable results: the files a study's report commits, and the report's input read back from them.

`lightning_cqk report runs/<study>-cpu --output docs/results/<study>` writes, beside the Markdown, CSVs and figures:

    study.json        the sweep's manifest (spec as expanded, runs with their groups, seeds, levels, config hashes
                      and code revisions, package versions)
    runs.csv          one row per run: run, group, role (tuning for a learning-rate grid run), seed, lr, final val
                      loss / ppl / bpb, the held-out loss of a grid run, tokens, steps, train seconds, FLOPs, code
                      revision, config hash, status ('done', or why the run is not scored)
    curves.csv        run, tag, step, value: every validation (val/ppl, val/bpb, val/loss) and, at those steps, the
                      training tokens, cumulative loss spikes and gradient norm (what the figures draw)
    val_windows.json  the final validation's per-window losses of every run ({"tokens": {run: [...]}, "nll":
                      {run: [...]}}; the tokens most runs share once, under "*"), when at most
                      MAX_WINDOW_VALUES numbers

`lightning_cqk report docs/results/<study>` then reads these files instead of run directories and recomputes every
number, verdict and figure: nothing else is needed. Floats are written with repr, so they read back bit-identical.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STUDY_FILE, RUNS_FILE, CURVES_FILE, WINDOWS_FILE = "study.json", "runs.csv", "curves.csv", "val_windows.json"
COMMITTED = (STUDY_FILE, RUNS_FILE, CURVES_FILE, WINDOWS_FILE)
VAL_TAGS = ("val/ppl", "val/bpb", "val/loss")
AT_VAL_TAGS = ("train/tokens_seen", "train/spikes", "train/grad_norm/total")  # thinned to the validation steps
MAX_WINDOW_VALUES = 200_000
RUN_FIELDS = (
    "run",
    "group",
    "role",
    "seed",
    "lr",
    "val_loss",
    "val_ppl",
    "val_bpb",
    "heldout_loss",
    "spikes",
    "late_loss_sd_pct",
    "tokens",
    "steps",
    "wallclock",
    "flops",
    "tokens_per_step",
    "code_revision",
    "config_hash",
    "status",
)
_BUDGET = ("tokens", "steps", "wallclock", "flops", "tokens_per_step")


def is_committed(folder: str | Path) -> bool:
    """True for a folder of committed results (study.json and runs.csv) rather than a sweep directory."""
    folder = Path(folder)
    return (folder / STUDY_FILE).is_file() and (folder / RUNS_FILE).is_file()


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _num(x: Any) -> str:
    if isinstance(x, bool) or x is None:
        return "" if x is None else str(x)
    if isinstance(x, int):
        return str(x)
    return repr(float(x)) if isinstance(x, float) else str(x)


def _final(run: dict[str, Any], tag: str) -> float:
    series = run["scalars"].get(tag) or []
    return series[-1][1] if series else math.nan


def run_lr(entry: dict[str, Any], data: dict[str, Any]) -> float:
    """A run's learning rate: its override (a tuned level's: the grid's choice), else its config files'."""
    value = (entry.get("overrides") or {}).get("model.optim.lr")
    if isinstance(value, str) and value.startswith("{tuned_lr:"):
        from lightning_cqk.sweep.tuning import TuningError, auto_scale, parse_tuned

        parsed = parse_tuned(value)
        if not parsed:
            return math.nan
        level, scale, target = parsed
        chosen = float(data.get("tuning", {}).get("chosen", {}).get(level, math.nan))
        if target is not None and math.isfinite(chosen):  # lr_scale auto: the scale the grid chose at launch
            rows = data.get("tuning", {}).get("rows") or []
            points = [(lr, loss) for lv, lr, _, loss in rows if lv == level]
            metric = data.get("manifest", {}).get("spec", {}).get("metric", "val/ppl")
            try:
                scale = auto_scale(points, chosen, target, metric)
            except TuningError:
                return math.nan
        return chosen * scale if scale is not None else chosen
    if value is not None:
        return float(value)
    from lightning_cqk.sweep.estimate import resolve

    try:
        return float(resolve(entry.get("configs") or [], {})["model"]["optim"].get("lr", math.nan))
    except (OSError, TypeError, ValueError):
        return math.nan


def write_committed(data: dict[str, Any], out: Path) -> list[Path]:
    """Write study.json, runs.csv, curves.csv and (when small) val_windows.json into `out`; returns their paths."""
    manifest = data["manifest"]
    finished = {r["name"]: r for g in data["groups"].values() for r in g["runs"]}
    finished.update({r["name"]: r for r in data.get("tuning_runs", [])})
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=RUN_FIELDS, lineterminator="\n")
    writer.writeheader()
    curves = io.StringIO()
    cw = csv.writer(curves, lineterminator="\n")
    cw.writerow(["run", "tag", "step", "value"])
    windows: dict[str, dict[str, list[float]]] = {"tokens": {}, "nll": {}}
    grids = (manifest["spec"].get("tuning") or {}).get("grid", {})
    tuning_names = {name for grid in grids.values() for name in grid.values()}
    for entry in manifest["runs"]:
        name = entry["name"]
        run = finished.get(name)
        status = "done" if run else data["unfinished"].get(name, "not started" if name in data["missing"] else "")
        budget = run["budget"] if run else {}
        revs = entry.get("revisions") or []
        row = {
            "run": name,
            "group": entry["group"],
            "role": "tuning" if name in tuning_names else "",
            "seed": entry["seed"],
            "lr": run_lr(entry, data),
            "val_loss": _final(run, "val/loss") if run else math.nan,
            "val_ppl": _final(run, "val/ppl") if run else math.nan,
            "val_bpb": _final(run, "val/bpb") if run else math.nan,
            "heldout_loss": (run or {}).get("heldout_loss", math.nan),
            "spikes": (run or {}).get("stability", {}).get("spikes", math.nan),
            "late_loss_sd_pct": (run or {}).get("stability", {}).get("late_loss_sd_pct", math.nan),
            "code_revision": " ".join(revs),
            "config_hash": entry.get("config_hash", ""),
            "status": status,
        }
        row.update({k: budget.get(k, math.nan) for k in _BUDGET})
        text = ("run", "group", "role", "code_revision", "status")
        writer.writerow({k: v if k in text else _num(v) for k, v in row.items()})
        if not run:
            continue
        val_steps = sorted({s for tag in VAL_TAGS for s, _ in run["scalars"].get(tag) or []})
        for tag in VAL_TAGS:
            for step, value in run["scalars"].get(tag) or []:
                cw.writerow([name, tag, step, repr(float(value))])
        for tag in AT_VAL_TAGS:
            series = dict(run["scalars"].get(tag) or [])
            for step in val_steps:
                if step in series:
                    cw.writerow([name, tag, step, repr(float(series[step]))])
        w = run.get("windows")
        if w and w.get("nll"):
            windows["tokens"][name], windows["nll"][name] = list(w["tokens"]), list(w["nll"])
    paths = [out / STUDY_FILE, out / RUNS_FILE, out / CURVES_FILE]
    _write(paths[0], json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    _write(paths[1], buf.getvalue())
    _write(paths[2], curves.getvalue())
    if windows["tokens"]:  # most runs' windows hold the same tokens (one validation set): stored once, under "*"
        counts: dict[str, int] = {}
        for t in windows["tokens"].values():
            counts[json.dumps(t)] = counts.get(json.dumps(t), 0) + 1
        common = max(counts, key=counts.get)
        others = {name: t for name, t in windows["tokens"].items() if json.dumps(t) != common}
        windows["tokens"] = {"*": json.loads(common), **others}
    n_values = sum(len(v) for v in windows["nll"].values()) + sum(len(v) for v in windows["tokens"].values())
    if windows["nll"] and n_values <= MAX_WINDOW_VALUES:
        paths.append(out / WINDOWS_FILE)
        _write(paths[-1], json.dumps(windows, separators=(",", ":")) + "\n")
    return paths


def _float(text: str) -> float:
    return float(text) if text not in ("", None) else math.nan


def read_committed(folder: str | Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, str]]:
    """(manifest, {run name: {"seed", "scalars", "budget", "windows", "heldout_loss"}} of the finished runs,
    {run name: status} of the others) from a folder of committed results."""
    folder = Path(folder)
    manifest = json.loads((folder / STUDY_FILE).read_text())
    with open(folder / RUNS_FILE, newline="") as handle:
        rows = list(csv.DictReader(handle))
    scalars: dict[str, dict[str, list[tuple[int, float]]]] = {}
    if (folder / CURVES_FILE).is_file():
        with open(folder / CURVES_FILE, newline="") as handle:
            for r in csv.DictReader(handle):
                scalars.setdefault(r["run"], {}).setdefault(r["tag"], []).append((int(r["step"]), float(r["value"])))
    windows = json.loads((folder / WINDOWS_FILE).read_text()) if (folder / WINDOWS_FILE).is_file() else {}
    runs, other = {}, {}
    for r in rows:
        if r["status"] != "done":
            other[r["run"]] = r["status"]
            continue
        name = r["run"]
        budget: dict[str, Any] = {k: _float(r[k]) for k in _BUDGET if math.isfinite(_float(r[k]))}
        for key in ("steps", "tokens", "tokens_per_step"):  # integers in budget.json: read back as integers
            if key in budget and "." not in r[key] and "e" not in r[key]:
                budget[key] = int(r[key])
        w = None
        if name in (windows.get("nll") or {}):
            tokens = windows["tokens"]
            w = {"nll": windows["nll"][name], "tokens": tokens[name] if name in tokens else tokens["*"]}
        runs[name] = {
            "seed": int(r["seed"]),
            "scalars": {tag: sorted(series) for tag, series in scalars.get(name, {}).items()},
            "budget": budget,
            "windows": w,
            "heldout_loss": _float(r["heldout_loss"]),
            "stability": {"spikes": _float(r["spikes"]), "late_loss_sd_pct": _float(r["late_loss_sd_pct"])},
        }
    return manifest, runs, other


def _sibling_runs(folder: Path) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """(study, rows of its runs.csv) of every sibling folder of committed results beside `folder`."""
    if not folder.parent.is_dir():
        return
    for other in sorted(folder.parent.iterdir()):
        path = other / RUNS_FILE
        if other.resolve() == folder.resolve() or not path.is_file():
            continue
        with open(path, newline="") as handle:
            yield other.name, list(csv.DictReader(handle))


def shared_runs(folder: Path, manifest: dict[str, Any]) -> dict[str, list[str]]:
    """{other study: [runs of this study with the same config hash]} over the sibling folders of committed results
    (a run with identical configs, overrides and seed is the same run: the report names it in both studies)."""
    mine = {r.get("config_hash"): r["name"] for r in manifest.get("runs", []) if r.get("config_hash")}
    out: dict[str, list[str]] = {}
    for study, rows in _sibling_runs(folder):
        same = sorted(mine[h] for h in {r.get("config_hash") for r in rows} if h in mine)
        if same:
            out[study] = same
    return out


def _fingerprint(seed: Any, lr: Any, tokens: Any, steps: Any, ppl: Any, loss: Any) -> tuple[Any, ...] | None:
    """(seed, lr, tokens, steps, final val ppl, final val loss) as floats (the loss as text: a run that logged none
    has "nan" on both sides); None unless the first five are finite (an unfinished run)."""
    try:
        values = tuple(float(x) for x in (seed, lr, tokens, steps, ppl))
        last = repr(float(loss)) if loss not in (None, "") else "nan"
    except (TypeError, ValueError):
        return None
    return (*values, last) if all(math.isfinite(v) for v in values) else None


def same_results(folder: Path, data: dict[str, Any]) -> dict[str, list[str]]:
    """{other study: ["<run> = <its run>"]} for this study's finished runs whose seed, learning rate, tokens, steps,
    final validation perplexity and loss equal, to the last digit, those of a run under another config hash in a
    sibling folder of committed results: the same settings run again under another name (a level called
    `standard-B` here and `standard` there; training is deterministic), which `shared_runs` cannot see because the
    hashes hold the levels' names. Runs with the same config hash are left to `shared_runs`."""
    entries = {e["name"]: e for e in data["manifest"].get("runs", [])}
    finished = [r for g in data["groups"].values() for r in g["runs"]] + list(data.get("tuning_runs", []))
    mine: dict[tuple[float, ...], list[tuple[str, str]]] = {}
    for run in finished:
        entry = entries.get(run["name"], {})
        budget = run.get("budget") or {}
        key = _fingerprint(
            entry.get("seed"),
            run_lr(entry, data),
            budget.get("tokens"),
            budget.get("steps"),
            _final(run, "val/ppl"),
            _final(run, "val/loss"),
        )
        if key is not None:
            mine.setdefault(key, []).append((run["name"], entry.get("config_hash", "")))
    out: dict[str, list[str]] = {}
    for study, rows in _sibling_runs(folder):
        pairs = []
        for row in rows:
            key = _fingerprint(*(row.get(k) for k in ("seed", "lr", "tokens", "steps", "val_ppl", "val_loss")))
            for name, config_hash in mine.get(key, []) if key is not None else []:
                if config_hash != row.get("config_hash"):
                    pairs.append(f"{name} = {row['run']}")
        if pairs:
            out[study] = sorted(pairs)
    return out
    for other in sorted(folder.parent.iterdir()):
        path = other / RUNS_FILE
        if other.resolve() == folder.resolve() or not path.is_file():
            continue
        pairs = []
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                key = _fingerprint(
                    row.get("seed"),
                    row.get("lr"),
                    row.get("tokens"),
                    row.get("steps"),
                    row.get("val_ppl"),
                    row.get("val_loss"),
                )
                for name, config_hash in mine.get(key, []) if key is not None else []:
                    if config_hash != row.get("config_hash"):
                        pairs.append(f"{name} = {row['run']}")
        if pairs:
            out[other.name] = sorted(pairs)
    return out
