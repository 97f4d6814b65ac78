"""The GLUE table of a checkpoint: ``glue.json`` (the numbers) and ``glue.md`` (the table), and side-by-side tables.

``glue.json`` (written by ``lightning_cqk glue`` beside the checkpoint)::

    {"format": "lightning_cqk.glue/1", "checkpoint": "<path>", "created": "<UTC ISO time>", "seeds": [1, 2, 3],
     "settings": {...},                                   # the fine-tuning options every task ran with
     "tasks": {"cola": {"status": "ok", "metrics": {"mcc": {"mean": 0.05, "std": 0.01, "per_seed": [...]}},
                        "score": 0.05, "train": "...", "eval": "...", "heldout": false},
               "qqp":  {"status": "skipped", "reason": "No training data for GLUE qqp in ..."}},
     "average": 0.51, "average_over": ["cola", "sst2", ...]}

Metric values are fractions; ``score`` is the mean of a task's metrics (``glue_metrics.task_score``) averaged over
seeds; ``average`` is the mean score over the tasks that ran. With tasks missing it is *not* the official GLUE
score, and the table says over which tasks it was taken. ``std`` is the sample standard deviation over seeds (0 for
one seed).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from lightning_cqk.downstream.glue_tasks import GLUE_TASKS
from lightning_cqk.files.atomic import write_json_atomically

FORMAT = "lightning_cqk.glue/1"
JSON_NAME, MD_NAME = "glue.json", "glue.md"
METRIC_LABELS = {"mcc": "MCC", "acc": "acc", "f1": "F1", "pearson": "Pearson", "spearman": "Spearman"}


def summarise_seeds(per_seed: list[dict[str, float]]) -> dict[str, Any]:
    """Per-seed metric dicts (as ``GlueClassifier.final_metrics``) -> the ``metrics`` and ``score`` of a task entry."""
    names = [k for k in per_seed[0] if k != "score"]
    metrics = {}
    for name in names:
        values = [run[name] for run in per_seed]
        metrics[name] = {
            "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "per_seed": values,
        }
    return {"metrics": metrics, "score": statistics.fmean(run["score"] for run in per_seed)}


def finish_table(table: dict[str, Any]) -> dict[str, Any]:
    """Fill in ``average`` and ``average_over`` from the task entries (GLUE's task order)."""
    ran = [name for name in GLUE_TASKS if table["tasks"].get(name, {}).get("status") == "ok"]
    table["average_over"] = ran
    table["average"] = statistics.fmean(table["tasks"][n]["score"] for n in ran) if ran else None
    return table


def write_glue_table(table: dict[str, Any], out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``glue.json`` and ``glue.md`` into ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = finish_table({"format": FORMAT, **table})
    json_path, md_path = out_dir / JSON_NAME, out_dir / MD_NAME
    write_json_atomically(json_path, table)
    md_path.write_text(render_table(table) + "\n")
    return json_path, md_path


def load_glue_table(path: str | Path) -> dict[str, Any]:
    """A ``glue.json`` by path, or the one in a directory (or beside a checkpoint file)."""
    path = Path(path)
    candidate = path if path.suffix == ".json" else (path.parent if path.is_file() else path) / JSON_NAME
    if not candidate.is_file():
        raise FileNotFoundError(f"No {JSON_NAME} at {candidate}; run `lightning_cqk glue --checkpoint <ckpt>` first.")
    table = json.loads(candidate.read_text())
    if table.get("format") != FORMAT:
        raise ValueError(f"{candidate} is not a GLUE table of this framework (format {table.get('format')!r}).")
    table["_path"] = str(candidate)
    return table


def find_glue_tables(paths: list[str | Path]) -> list[Path]:
    """``glue.json`` files named by the paths: files, checkpoint files (their directory), or directories (searched)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            hits = sorted(p.rglob(JSON_NAME))
            if not hits:
                raise FileNotFoundError(f"No {JSON_NAME} under {p}.")
            found += hits
        else:
            found.append(Path(load_glue_table(p)["_path"]))
    return found


def _fmt(entry: dict[str, Any], metric: str) -> str:
    m = entry["metrics"][metric]
    return f"{100 * m['mean']:.1f}" + (f" ± {100 * m['std']:.1f}" if len(m["per_seed"]) > 1 else "")


def _task_cell(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "-"
    if entry.get("status") != "ok":
        return "skipped"
    return " / ".join(_fmt(entry, metric) for metric in entry["metrics"])


def _task_header(name: str) -> str:
    task = GLUE_TASKS[name]
    metrics = "/".join(METRIC_LABELS[m] for m in task.metrics)
    if len(task.eval_splits) > 1:
        metrics = "/".join(f"{s[0] if s == 'matched' else 'mm'} {metrics}" for s in task.eval_splits)
    return f"{task.folder} ({metrics})"


def render_table(table: dict[str, Any]) -> str:
    """One checkpoint's table in Markdown: a row per task with its metrics (x 100, mean ± std over seeds)."""
    lines = [
        f"GLUE dev results of `{table['checkpoint']}`, seeds {table.get('seeds')}, metrics x 100 (mean ± std over "
        "seeds).",
        "",
        "| task | metric(s) | result | score | train | eval |",
        "|---|---|---|---|---|---|",
    ]
    for name in GLUE_TASKS:
        entry = table["tasks"].get(name)
        if entry is None:
            continue
        if entry.get("status") != "ok":
            lines.append(f"| {GLUE_TASKS[name].folder} | | skipped | | {entry.get('reason', '')} | |")
            continue
        metrics = ", ".join(entry["metrics"])
        lines.append(
            f"| {GLUE_TASKS[name].folder} | {metrics} | {_task_cell(entry)} | {100 * entry['score']:.1f} | "
            f"{entry.get('train', '')} | {entry.get('eval', '')} |"
        )
    average = table.get("average")
    over = table.get("average_over") or []
    avg = "n/a" if average is None else f"{100 * average:.1f}"
    lines += ["", f"Average score over {len(over)} of {len(GLUE_TASKS)} tasks ({', '.join(over)}): {avg}."]
    if len(over) < len(GLUE_TASKS):
        lines.append("Not the official GLUE score: tasks are missing, and dev sets (or held-out train) are used.")
    return "\n".join(lines)


def render_side_by_side(tables: list[dict[str, Any]], labels: list[str] | None = None) -> str:
    """Several checkpoints' GLUE tables as one Markdown table: a column per checkpoint, a row per task + average.

    Args:
        tables: loaded ``glue.json`` dicts.
        labels: column titles (default: each checkpoint's run name).
    """
    from lightning_cqk.run.directory import checkpoint_run_name

    if not tables:
        raise ValueError("no GLUE tables to show")
    labels = labels or [checkpoint_run_name(t["checkpoint"]) for t in tables]
    names = [n for n in GLUE_TASKS if any(n in t["tasks"] for t in tables)]
    lines = ["| task | " + " | ".join(labels) + " |", "|---|" + "---|" * len(tables)]
    for name in names:
        lines.append(f"| {_task_header(name)} | " + " | ".join(_task_cell(t["tasks"].get(name)) for t in tables) + " |")
    cells = []
    for t in tables:
        avg = t.get("average")
        cells.append("n/a" if avg is None or math.isnan(avg) else f"{100 * avg:.1f} ({len(t['average_over'])} tasks)")
    lines.append("| **average score** | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def side_by_side(paths: list[str | Path], labels: list[str] | None = None) -> str:
    """The GLUE tables found at ``paths`` (``glue.json`` files, checkpoints, run directories searched recursively)
    side by side, in Markdown: the one call a report needs."""
    tables = [load_glue_table(p) for p in find_glue_tables(paths)]
    if labels is not None and len(labels) != len(tables):
        raise ValueError(f"{len(labels)} labels for {len(tables)} GLUE tables ({[t['_path'] for t in tables]}).")
    return render_side_by_side(tables, labels)
