"""Recomputable results: the files a study's report commits, and the report's input read back from them.

`lightning_cqk report runs/<study>-cpu --output docs/results/<study>` writes, beside the Markdown, CSVs and figures:

    study.json        the sweep's manifest (spec as expanded, runs with their groups, seeds, levels, config hashes
                      and code revisions, package versions)
    runs.csv          one row per run: run, group, role (tuning for a learning-rate grid run), seed, lr, final val
                      loss / ppl / bpb, the held-out loss of a grid run, tokens, steps, train seconds, FLOPs, code
                      revision, config hash, status ('done', or why the run is not scored)
    curves.csv        run, tag, step, value: every validation (val/ppl, val/bpb, val/loss) and, at those steps, the
                      training tokens, cumulative loss spikes and gradient norm (what the figures draw); the tokens
                      and spikes also at the last step they were logged, and train/loss over the late window
                      (estimators.late_loss_points): the sources runs.csv's tokens, spikes and late_loss_sd_pct are
                      recomputed from (second_sources.py)
    val_windows.json  the final validation's per-window losses of every run ({"tokens": {run: [...]}, "nll":
                      {run: [...]}}; the tokens most runs share once, under "*"), when at most
                      MAX_WINDOW_VALUES numbers, else of the learning-rate grid's runs only (their held-out
                      losses' source)

`lightning_cqk report docs/results/<study>` then reads these files instead of run directories and recomputes every
number, verdict and figure: nothing else is needed. Floats are written with repr, so they read back bit-identical.

The files are read as untrusted (a hand-edited or merged folder): each must be a plain file with the columns a report
writes; the manifest's runs must be one per name and per (group, seed), named `<group>-s<seed>` with plain names
(`check_manifest`, for a sweep's manifest.json too); curves.csv holds one value per run, tag and step, each one a
float32 TensorBoard can have logged (perplexity at least 1, loss and bits per byte at least 0); and runs.csv holds one
row per run of the manifest, with its group, seed, role, config hash and code revision, and, for a finished run, the
final validation values of curves.csv, exactly, and every other number a verdict, a grid choice or a control reads as
recomputed from its second committed source (second_sources.py: spikes, late train-loss sd, held-out loss, learning
rate, tokens, steps). Anything else is refused, naming the file and line: the report copies runs.csv into its new
folder and reads its numbers, so a value that disagrees with its source would be published and judged.
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

from lightning_cqk.files.atomic import write_text_atomically
from lightning_cqk.study.design.tuned_rate import all_grid_runs
from lightning_cqk.study.judge.group_estimates import late_loss_points
from lightning_cqk.study.results_model import StudyData

STUDY_FILE, RUNS_FILE, CURVES_FILE, WINDOWS_FILE = "study.json", "runs.csv", "curves.csv", "val_windows.json"
CURVE_FIELDS = ("run", "tag", "step", "value")
FLOAT32_MAX = 3.4028234663852886e38  # TensorBoard stores scalars as float32: no logged value is larger
LOWEST = {"val/ppl": 1.0, "val/loss": 0.0, "val/bpb": 0.0}  # a perplexity is exp(loss >= 0)
COMMITTED = (STUDY_FILE, RUNS_FILE, CURVES_FILE, WINDOWS_FILE)
VAL_TAGS = ("val/ppl", "val/bpb", "val/loss")
AT_VAL_TAGS = ("train/tokens_seen", "train/spikes", "train/grad_norm/total")  # thinned to the validation steps
SOURCE_TAGS = ("train/tokens_seen", "train/spikes")  # and at their last logged step: runs.csv's tokens, spikes
LOSS_TAG = "train/loss"  # its late window (estimators.late_loss_points): runs.csv's late_loss_sd_pct
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
    "identity",
    "status",
)
LEGACY_RUN_FIELDS = tuple(f for f in RUN_FIELDS if f != "identity")  # runs.csv of reports before identities (issue 43)
_BUDGET = ("tokens", "steps", "wallclock", "flops", "tokens_per_step")
STABILITY_FIELDS = ("spikes", "late_loss_sd_pct")


def is_committed(folder: str | Path) -> bool:
    """True for a folder of committed results (study.json and runs.csv) rather than a sweep directory."""
    folder = Path(folder)
    return (folder / STUDY_FILE).is_file() and (folder / RUNS_FILE).is_file()


def _num(x: Any) -> str:
    if isinstance(x, bool) or x is None:
        return "" if x is None else str(x)
    if isinstance(x, int):
        return str(x)
    return repr(float(x)) if isinstance(x, float) else str(x)


def _final(run: dict[str, Any], tag: str) -> float:
    series = run["scalars"].get(tag) or []
    return series[-1][1] if series else math.nan


def run_lr(entry: dict[str, Any], data: StudyData, run: dict[str, Any] | None = None) -> float:
    """A run's learning rate: for a finished run (`run`, from collect), the rate it recorded (its config.yaml, or the
    committed runs.csv); for one not finished, its override (a tuned level's: the grid's choice, as the runner will
    fill it in: run/tuned_overrides.resolve_overrides), else its config files'."""
    recorded = float((run or {}).get("lr", math.nan))
    if math.isfinite(recorded):
        return recorded
    value = (entry.get("overrides") or {}).get("model.optim.lr")
    from lightning_cqk.study.design.tuned_rate import is_tuned_rate

    if is_tuned_rate(value):
        from lightning_cqk.study.design.tuned_rate import TuningError, auto_scale, parse_tuned

        parsed = parse_tuned(value)
        if not parsed:
            return math.nan
        level, scale, target = parsed.level, parsed.scale, parsed.auto_target_pct
        chosen = float(data.tuning.chosen.get(level, math.nan))
        if target is not None and math.isfinite(chosen):  # lr_scale auto: the scale the grid chose at launch
            rows = data.tuning.rows
            points = [(lr, loss) for lv, lr, _, loss in rows if lv == level]
            metric = data.manifest.get("spec", {}).get("metric", "val/ppl")
            try:
                scale = auto_scale(points, chosen, target, metric)
            except TuningError:
                return math.nan
        return chosen * scale if scale is not None else chosen
    if value is not None:
        return float(value)
    from lightning_cqk.study.design.cost_estimate import resolve

    try:
        return float(resolve(entry.get("configs") or [], {})["model"]["optim"].get("lr", math.nan))
    except (OSError, TypeError, ValueError):
        return math.nan


def write_committed(data: StudyData, out: Path) -> list[Path]:
    """Write study.json, runs.csv, curves.csv and (when small) val_windows.json into `out`; returns their paths."""
    manifest = data.manifest
    finished = {r["name"]: r for g in data.groups.values() for r in g.runs}
    finished.update({r["name"]: r for r in data.tuning_runs})
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=RUN_FIELDS, lineterminator="\n")
    writer.writeheader()
    curves = io.StringIO()
    cw = csv.writer(curves, lineterminator="\n")
    cw.writerow(["run", "tag", "step", "value"])
    windows: dict[str, dict[str, list[float]]] = {"tokens": {}, "nll": {}}
    grids = (manifest["spec"].get("tuning") or {}).get("grid", {})
    tuning_names = all_grid_runs({"grid": grids})
    for entry in manifest["runs"]:
        name = entry["name"]
        run = finished.get(name)
        status = "done" if run else data.unfinished.get(name, "not started" if name in data.missing else "")
        budget = run["budget"] if run else {}
        revs = entry.get("revisions") or []
        row = {
            "run": name,
            "group": entry["group"],
            "role": "tuning" if name in tuning_names else "",
            "seed": entry["seed"],
            "lr": run_lr(entry, data, run),
            "val_loss": _final(run, "val/loss") if run else math.nan,
            "val_ppl": _final(run, "val/ppl") if run else math.nan,
            "val_bpb": _final(run, "val/bpb") if run else math.nan,
            "heldout_loss": (run or {}).get("heldout_loss", math.nan),
            "spikes": (run or {}).get("stability", {}).get("spikes", math.nan),
            "late_loss_sd_pct": (run or {}).get("stability", {}).get("late_loss_sd_pct", math.nan),
            "code_revision": " ".join(revs),
            "config_hash": entry.get("config_hash", ""),
            "identity": entry.get("identity", ""),  # study/run/identity.py: what computed it (study.json: its parts)
            "status": status,
        }
        row.update({k: budget.get(k, math.nan) for k in _BUDGET})
        text = ("run", "group", "role", "code_revision", "identity", "status")
        writer.writerow({k: v if k in text else _num(v) for k, v in row.items()})
        if not run:
            continue
        val_steps = sorted({s for tag in VAL_TAGS for s, _ in run["scalars"].get(tag) or []})
        for tag in VAL_TAGS:
            for step, value in run["scalars"].get(tag) or []:
                cw.writerow([name, tag, step, repr(float(value))])
        for tag in AT_VAL_TAGS:
            logged = run["scalars"].get(tag) or []
            series = dict(logged)
            kept = set(val_steps) | ({logged[-1][0]} if logged and tag in SOURCE_TAGS else set())
            for step in sorted(kept):
                if step in series:
                    cw.writerow([name, tag, step, repr(float(series[step]))])
        for step, value in late_loss_points(run["scalars"].get(LOSS_TAG) or []):
            cw.writerow([name, LOSS_TAG, step, repr(float(value))])
        w = run.get("windows")
        if w and w.get("nll"):
            windows["tokens"][name], windows["nll"][name] = list(w["tokens"]), list(w["nll"])
    paths = [out / STUDY_FILE, out / RUNS_FILE, out / CURVES_FILE]
    write_text_atomically(paths[0], json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    write_text_atomically(paths[1], buf.getvalue())
    write_text_atomically(paths[2], curves.getvalue())
    shared = _shared_tokens(windows)
    if _n_values(shared) > MAX_WINDOW_VALUES:  # too many to commit: the grid runs' (their held-out losses' source)
        shared = _shared_tokens(
            {key: {n: v for n, v in by_run.items() if n in tuning_names} for key, by_run in windows.items()}
        )
    if shared["nll"]:
        paths.append(out / WINDOWS_FILE)
        write_text_atomically(paths[-1], json.dumps(shared, separators=(",", ":")) + "\n")
    return paths


def _shared_tokens(windows: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, list[float]]]:
    """val_windows.json's content: most runs' windows hold the same tokens (one validation set), stored once, "*"."""
    if not windows["tokens"]:
        return {"tokens": {}, "nll": dict(windows["nll"])}
    counts: dict[str, int] = {}
    for t in windows["tokens"].values():
        counts[json.dumps(t)] = counts.get(json.dumps(t), 0) + 1
    common = max(counts, key=counts.get)
    others = {name: t for name, t in windows["tokens"].items() if json.dumps(t) != common}
    return {"tokens": {"*": json.loads(common), **others}, "nll": dict(windows["nll"])}


def _n_values(windows: dict[str, dict[str, list[float]]]) -> int:
    return sum(len(v) for v in windows["nll"].values()) + sum(len(v) for v in windows["tokens"].values())


def _float(text: str) -> float:
    return float(text) if text not in ("", None) else math.nan


def _refuse(message: str) -> Exception:
    from lightning_cqk.study.results_model import ReportError

    return ReportError(message)


def _put_back(path: Path) -> str:
    """The advice for a committed file that is not what the report wrote."""
    return (
        f"Put back the file the report wrote (in a checkout: git checkout -- {path}), or write the report again from "
        f"the sweep's run directories with --output {path.parent}."
    )


def _plain_file(folder: Path, name: str) -> Path:
    """`folder / name`, refusing a symbolic link (or a folder, a device...): the report copies its committed files
    into the new report, so a link to a system file would be read as results and then published."""
    path = folder / name
    if path.is_symlink() or (path.exists() and not path.is_file()):
        what = f"a symbolic link to {os.readlink(path)}" if path.is_symlink() else "not a regular file"
        raise _refuse(
            f"{path} is {what}; the committed results of a report are plain files it wrote. Delete it (rm {path}) "
            f"and put back the file the report wrote (in a checkout: git checkout -- {path})."
        )
    return path


def _csv_rows(
    path: Path, fields: tuple[str, ...], legacy: tuple[str, ...] | None = None
) -> list[tuple[int, dict[str, str]]]:
    """(line, row) of a committed CSV, refusing a file whose header or rows are not the report's `fields` (or the
    `legacy` header of an older report, whose missing columns read as "")."""
    try:
        with open(path, newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader, [])
            if legacy is not None and tuple(header) == legacy:
                return [(line, {**dict.fromkeys(fields, ""), **row}) for line, row in _csv_rows(path, legacy)]
            if tuple(header) != fields:
                raise _refuse(
                    f"{path} is not the {path.name} a report writes: its first line is {','.join(header)[:120]!r}, "
                    f"not {','.join(fields)!r}. {_put_back(path)}"
                )
            rows = []
            for values in reader:
                if len(values) != len(fields):
                    raise _refuse(
                        f"{path}, line {reader.line_num}: {len(values)} fields, not the {len(fields)} of its header "
                        f"({','.join(fields)}). {_put_back(path)}"
                    )
                rows.append((reader.line_num, dict(zip(fields, values, strict=True))))
    except (UnicodeDecodeError, csv.Error) as err:
        raise _refuse(f"{path} cannot be read as a CSV file ({err}). {_put_back(path)}") from None
    return rows


def _number(text: str, path: Path, line: int, column: str) -> float:
    try:
        return _float(text)
    except ValueError:
        raise _refuse(f"{path}, line {line}: {column} {text!r} is not a number. {_put_back(path)}") from None


def read_manifest(path: Path) -> dict[str, Any]:
    """A sweep's manifest.json or a committed study.json, checked (`check_manifest`)."""
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise _refuse(f"{path} is not JSON ({err}). {_put_back(path)}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("runs"), list):
        raise _refuse(f"{path} is not a sweep's manifest (a mapping with a list of runs). {_put_back(path)}")
    check_manifest(manifest, path)
    return manifest


def check_manifest(manifest: dict[str, Any], path: Path) -> None:
    """Refuse a manifest (a sweep's manifest.json, committed study.json) whose runs are not one per (group, seed),
    one per name, each named `<group>-s<seed>` with plain names (a name like `=HYPERLINK(...)` is a spreadsheet
    formula in the report's CSVs): the report pairs a group's runs by seed and would keep only one of two."""
    from lightning_cqk.study.design.spec_checks import NAME_RULE, is_safe_name

    by_seed: dict[tuple[str, Any], str] = {}
    for run in manifest.get("runs") or []:
        name, group, seed = run.get("name"), run.get("group"), run.get("seed")
        first = by_seed.setdefault((str(group), seed), str(name))
        if first != str(name):
            raise _refuse(
                f"{path}: runs {first} and {name} of group {group} both have seed {seed}. A study runs each group "
                "once per seed and the report pairs the groups' runs by seed, so it would keep one of the two and "
                "silently drop the other. This folder was edited or merged from two sweeps: remove one of the two "
                "runs, or report each sweep on its own."
            )
    names = [str(run.get("name")) for run in manifest.get("runs") or []]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise _refuse(f"{path}: run {twice[0]} is listed twice. Keep one entry per run (a sweep writes one).")
    for run in manifest.get("runs") or []:
        name, group, seed = run.get("name"), run.get("group"), run.get("seed")
        if not (is_safe_name(name) and is_safe_name(group)):
            raise _refuse(
                f"{path}: run {name!r} of group {group!r}: a sweep's run and group names are plain names "
                f"({NAME_RULE}); these were edited (a name like `=HYPERLINK(...)` would be a formula in a "
                "spreadsheet that opens the report's CSVs). Put back the names the sweep wrote."
            )
        if type(seed) is not int or name != f"{group}-s{seed}":
            raise _refuse(
                f"{path}: run {name!r} has group {group!r} and seed {seed!r}, but a sweep names each run "
                "<group>-s<seed>: one of the three was edited. Put back what the sweep wrote."
            )


def _read_curves(path: Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{run: {tag: [(step, value)] sorted by step}} of curves.csv, refusing two values at one step and a value no
    run can have logged (module docstring)."""
    scalars: dict[str, dict[str, list[tuple[int, float]]]] = {}
    seen: dict[tuple[str, str, int], tuple[int, str]] = {}
    for line, r in _csv_rows(path, CURVE_FIELDS):
        try:
            step = int(r["step"])
        except ValueError:
            raise _refuse(f"{path}, line {line}: step {r['step']!r} is not a whole number. {_put_back(path)}") from None
        value = _number(r["value"], path, line, "value")
        key = (r["run"], r["tag"], step)
        if key in seen:
            first, text = seen[key]
            raise _refuse(
                f"{path}, lines {first} and {line}: two values of {r['tag']} for run {r['run']} at step {step} "
                f"({text} and {r['value']}). A report writes one value per step (the last the run logged): one of "
                f"these rows was added by hand or by merging two folders. {_put_back(path)}"
            )
        seen[key] = (line, r["value"])
        _check_logged(value, r["tag"], f"{path}, line {line}: {r['tag']} of run {r['run']} at step {step}", path)
        scalars.setdefault(r["run"], {}).setdefault(r["tag"], []).append((step, value))
    return {run: {tag: sorted(series) for tag, series in tags.items()} for run, tags in scalars.items()}


def _check_logged(value: float, tag: str, what: str, path: Path) -> None:
    """Refuse a finite value that no run can have logged: beyond float32 (what TensorBoard stores), or a perplexity
    below 1 / a loss below 0. nan and inf stay: they are a diverged run's."""
    if not math.isfinite(value):
        return
    lowest = LOWEST.get(tag, -FLOAT32_MAX)
    if not lowest <= value <= FLOAT32_MAX:
        bound = (
            f"a {tag} is at least {lowest:g}"
            if value < lowest
            else f"a logged value is at most {FLOAT32_MAX:.3g}, the largest float32, which TensorBoard stores"
        )
        raise _refuse(f"{what} is {value!r}, which no run can have logged ({bound}). {_put_back(path)}")


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _check_rows(
    rows: list[tuple[int, dict[str, str]]], manifest: dict[str, Any], path: Path, identities: bool = True
) -> None:
    """runs.csv holds one row per run of the manifest, and each row's group, seed, role, config hash and code
    revision are the manifest's (what write_committed wrote)."""
    entries = {str(e["name"]): e for e in manifest.get("runs") or []}
    grids = (manifest.get("spec", {}).get("tuning") or {}).get("grid", {})
    tuning_names = all_grid_runs({"grid": grids})
    lines: dict[str, int] = {}
    for line, row in rows:
        name = row["run"]
        if name in lines:
            raise _refuse(f"{path}, lines {lines[name]} and {line}: two rows for run {name}. {_put_back(path)}")
        lines[name] = line
        entry = entries.get(name)
        if entry is None:
            raise _refuse(f"{path}, line {line}: run {name!r} is not a run of {STUDY_FILE}. {_put_back(path)}")
        wanted = {
            "group": str(entry["group"]),
            "seed": str(entry["seed"]),
            "role": "tuning" if name in tuning_names else "",
            "config_hash": str(entry.get("config_hash", "")),
            "code_revision": " ".join(entry.get("revisions") or []),
        }
        if identities:
            wanted["identity"] = str(entry.get("identity", ""))
        for column, value in wanted.items():
            if row[column] != value:
                raise _refuse(
                    f"{path}, line {line}: run {name}'s {column} is {row[column][:80]!r}, but {STUDY_FILE} gives "
                    f"{value!r}; the two must agree. {_put_back(path)}"
                )
    absent = [name for name in entries if name not in lines]
    if absent:
        raise _refuse(f"{path}: no row for run {absent[0]} of {STUDY_FILE}. {_put_back(path)}")


def _check_finals(rows: list[tuple[int, dict[str, str]]], scalars: dict[str, Any], path: Path) -> None:
    """The finished runs of runs.csv are the runs of curves.csv, and each one's final validation values in runs.csv
    are its last values in curves.csv (the verdicts come from curves.csv; runs.csv is published beside them)."""
    done = {row["run"] for _, row in rows if row["status"] == "done"}
    stray = sorted(set(scalars) - done)
    if stray:
        raise _refuse(
            f"{path.with_name(CURVES_FILE)} has curves of run {stray[0]}, which {path.name} does not list as done; "
            f"the two files must agree. {_put_back(path)}"
        )
    for line, row in rows:
        if row["run"] not in done:
            continue
        for column, tag in (("val_loss", "val/loss"), ("val_ppl", "val/ppl"), ("val_bpb", "val/bpb")):
            series = scalars.get(row["run"], {}).get(tag) or []
            last = series[-1][1] if series else math.nan
            given = _number(row[column], path, line, column)
            if not _same(given, last):
                raise _refuse(
                    f"{path}, line {line}: run {row['run']}'s {column} is {row[column]!r}, but its last {tag} in "
                    f"{CURVES_FILE} is {last!r} (the value the verdicts use); the two must agree. {_put_back(path)}"
                )


def _read_windows(path: Path) -> dict[str, Any]:
    """A committed val_windows.json: {"tokens": {run or "*": [numbers]}, "nll": {run: [numbers]}} (the source of
    the grid runs' held-out losses and the paired window errors), refusing anything else."""
    try:
        windows = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        windows = None
    shape_ok = isinstance(windows, dict) and all(isinstance(windows.get(k), dict) for k in ("tokens", "nll"))
    if not shape_ok or not all(
        isinstance(values, list) and all(type(x) in (int, float) for x in values)
        for key in ("tokens", "nll")
        for values in windows[key].values()
    ):
        raise _refuse(
            f'{path} is not the {WINDOWS_FILE} a report writes ({{"tokens": {{run: [numbers]}}, "nll": '
            f"{{run: [numbers]}}}}). {_put_back(path)}"
        )
    return windows


def read_committed(folder: str | Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, str]]:
    """(manifest, {run name: {"seed", "scalars", "budget", "windows", "heldout_loss", "lr"}} of the finished runs,
    {run name: status} of the others) from a folder of committed results, cross-checked (module docstring)."""
    folder = Path(folder)
    study_path, runs_path, curves_path = (_plain_file(folder, n) for n in (STUDY_FILE, RUNS_FILE, CURVES_FILE))
    manifest = read_manifest(study_path)
    rows = _csv_rows(runs_path, RUN_FIELDS, LEGACY_RUN_FIELDS)
    with open(runs_path, newline="") as handle:
        legacy = tuple(next(csv.reader(handle), [])) == LEGACY_RUN_FIELDS  # written before identities (issue 43)
    scalars = _read_curves(curves_path) if curves_path.is_file() else {}
    _check_rows(rows, manifest, runs_path, identities=not legacy)
    _check_finals(rows, scalars, runs_path)
    windows_path = _plain_file(folder, WINDOWS_FILE)
    windows = _read_windows(windows_path) if windows_path.is_file() else {}
    from lightning_cqk.study.report.second_sources import disagreements, run_windows

    for line, what in disagreements(rows, scalars, windows, manifest):
        if line is None:
            raise _refuse(f"{study_path}: {what}. {_put_back(study_path)}")
        raise _refuse(f"{runs_path}, line {line}: {what}; the two must agree. {_put_back(runs_path)}")
    runs, other = {}, {}
    for line, r in rows:
        if r["status"] != "done":
            other[r["run"]] = r["status"]
            continue
        name = r["run"]
        numbers = {k: _number(r[k], runs_path, line, k) for k in (*_BUDGET, "lr", "heldout_loss", *STABILITY_FIELDS)}
        budget: dict[str, Any] = {k: numbers[k] for k in _BUDGET if math.isfinite(numbers[k])}
        for key in ("steps", "tokens", "tokens_per_step"):  # integers in budget.json: read back as integers
            if key in budget and "." not in r[key] and "e" not in r[key]:
                budget[key] = int(r[key])
        w = run_windows(windows, name)
        runs[name] = {
            "seed": int(r["seed"]),
            "scalars": scalars.get(name, {}),
            "budget": budget,
            "windows": w,
            "heldout_loss": numbers["heldout_loss"],
            "stability": {k: numbers[k] for k in STABILITY_FIELDS},
            "lr": numbers["lr"],  # the rate the run trained at, as recorded
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


def same_results(folder: Path, data: StudyData) -> dict[str, list[str]]:
    """{other study: ["<run> = <its run>"]} for this study's finished runs whose seed, learning rate, tokens, steps,
    final validation perplexity and loss equal, to the last digit, those of a run under another config hash in a
    sibling folder of committed results: the same settings run again under another name (a level called
    `standard-B` here and `standard` there; training is deterministic), which `shared_runs` cannot see because the
    hashes hold the levels' names. Runs with the same config hash are left to `shared_runs`."""
    entries = {e["name"]: e for e in data.manifest.get("runs", [])}
    finished = [r for g in data.groups.values() for r in g.runs] + list(data.tuning_runs)
    mine: dict[tuple[float, ...], list[tuple[str, str]]] = {}
    for run in finished:
        entry = entries.get(run["name"], {})
        budget = run.get("budget") or {}
        key = _fingerprint(
            entry.get("seed"),
            run_lr(entry, data, run),
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
