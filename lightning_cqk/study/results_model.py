"""What a report reads about one study (`report_read.collect`), passed from stage to stage of the report: the
estimators (group_estimates.py), the rendering (render.py) and the committed files (results.py) read its fields."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class Group:
    """One group of a study: its levels (axis -> level) and its finished runs, each the numbers the report reads."""

    levels: dict[str, str] = dataclasses.field(default_factory=dict)
    runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TuningTable:
    """A study's learning-rate grid as the report reads it (judge/group_estimates.tuning_table): empty without one."""

    rows: list[tuple[str, float, str, float]] = dataclasses.field(default_factory=list)  # (level, lr, runs, loss)
    chosen: dict[str, float] = dataclasses.field(default_factory=dict)  # level -> its chosen rate
    spread: dict[tuple[str, float], float] = dataclasses.field(default_factory=dict)  # (level, lr) -> sd over seeds
    per_seed: dict[tuple[str, float], list[float]] = dataclasses.field(default_factory=dict)  # each seed's loss


class ReportError(ValueError):
    """A study whose runs cannot be reported (nothing finished, a committed folder that does not check out): the
    message says what is wrong and what to run."""


@dataclasses.dataclass
class StudyData:
    """One study's runs as read from a sweep directory or a folder of committed results (the same either way)."""

    manifest: dict[str, Any]  # the sweep's manifest.json (or the committed study.json): spec, runs, revisions
    groups: dict[str, Group] = dataclasses.field(default_factory=dict)  # by name
    missing: list[str] = dataclasses.field(default_factory=list)  # runs never started
    unfinished: dict[str, str] = dataclasses.field(default_factory=dict)  # run -> why it does not count
    tuning_runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # the grid's finished runs
    committed: bool = False  # read from committed results (study.json, runs.csv), not a sweep directory
    source: Path | None = None  # the folder it was read from
    tuning: TuningTable = dataclasses.field(default_factory=TuningTable)  # the grid's table
    #: other study -> this study's runs it committed too, by config hash (report/results.shared_runs)
    shared: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    #: other study -> ["<run> = <its run>"] of identical numbers under another config hash (results.same_results)
    same_results: dict[str, list[str]] = dataclasses.field(default_factory=dict)
