"""What a report reads about one study (`report_read.collect`), passed from stage to stage of the report: the
estimators (group_estimates.py), the rendering (render.py) and the committed files (results.py) read its fields."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any


class ReportError(ValueError):
    """A study whose runs cannot be reported (nothing finished, a committed folder that does not check out): the
    message says what is wrong and what to run."""


@dataclasses.dataclass
class StudyData:
    """One study's runs as read from a sweep directory or a folder of committed results (the same either way)."""

    manifest: dict[str, Any]  # the sweep's manifest.json (or the committed study.json): spec, runs, revisions
    groups: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # group -> levels, finished runs
    missing: list[str] = dataclasses.field(default_factory=list)  # runs never started
    unfinished: dict[str, str] = dataclasses.field(default_factory=dict)  # run -> why it does not count
    tuning_runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # the grid's finished runs
    committed: bool = False  # read from committed results (study.json, runs.csv), not a sweep directory
    source: Path | None = None  # the folder it was read from
    tuning: dict[str, Any] = dataclasses.field(default_factory=dict)  # the grid's table (estimators.tuning_table)
    shared: dict[str, Any] = dataclasses.field(
        default_factory=dict
    )  # runs shared with sibling studies (report_command.py)
    same_results: dict[str, Any] = dataclasses.field(default_factory=dict)  # runs of identical numbers (results.py)
