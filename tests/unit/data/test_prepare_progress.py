"""The prepare progress bar: the parent's watcher counts finished work units from the workers' report files."""

from __future__ import annotations

import time
from pathlib import Path

from lightning_cqk.data.prepare import watch_progress
from lightning_cqk.data.sources import WorkUnit


def test_watcher_counts_finished_units(tmp_path: Path):
    text = tmp_path / "t.txt"
    text.write_bytes(b"x" * 3000)
    jobs = [(WorkUnit(str(text), 0, 1000), "train"), (WorkUnit(str(text), 1000, None), "train")]
    reports = tmp_path / "reports"
    reports.mkdir()
    with watch_progress(reports, jobs, "prepare train", interval=0.01) as done:
        (reports / "stats-000001.json").write_text("{}")
        (reports / "stats-000000.json.tmp").write_text("{}")  # a report still being written does not count
        deadline = time.monotonic() + 5
        while done != {1} and time.monotonic() < deadline:
            time.sleep(0.01)
        assert done == {1}
        (reports / "error-000000.json").write_text("{}")  # a failed unit is finished too
        while done != {0, 1} and time.monotonic() < deadline:
            time.sleep(0.01)
    assert done == {0, 1}
