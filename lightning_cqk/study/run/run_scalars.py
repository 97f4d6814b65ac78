"""A run's logged scalars, read from the TensorBoard event files in its directory (the report reads them, and
adoption compares a probe's with its committed twin's)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def read_scalars(run_dir: str | Path, tags: Iterable[str] | None = None) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...] sorted by step} from the TensorBoard event files directly in `run_dir`.

    For a step written more than once (a resumed run), the value written last (by wall time) wins.
    """
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(
        str(run_dir), size_guidance={event_accumulator.SCALARS: 0}, purge_orphaned_data=False
    )
    acc.Reload()
    wanted = acc.Tags().get("scalars", [])
    if tags is not None:
        wanted = [t for t in wanted if t in set(tags)]
    out: dict[str, list[tuple[int, float]]] = {}
    for tag in wanted:
        last: dict[int, tuple[float, float]] = {}
        for event in acc.Scalars(tag):
            if event.step not in last or event.wall_time >= last[event.step][0]:
                last[event.step] = (event.wall_time, float(event.value))
        out[tag] = [(step, last[step][1]) for step in sorted(last)]
    return out
