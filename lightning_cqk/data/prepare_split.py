"""One split of ``prepare``, tokenized with litdata: the parent's side of the workers in ``prepare_worker.py``.

``write_split`` hands a split's work units to litdata's ``optimize`` and checks what comes back: every unit
reported, the counts added up, and litdata's ``index.json`` holding exactly the tokens the workers wrote. Around each
``optimize`` it undoes what litdata changes process-wide (``_litdata_sandbox``: the start method, the SIGINT handler,
``DATA_OPTIMIZER_*`` and the shared ``$TMPDIR`` caches), stops the workers litdata leaves running when it raises
(``_stopping_leftover_processes``) and shows a progress bar on a terminal (``watch_progress``).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import numpy as np

from lightning_cqk.data.manifest import SplitStats
from lightning_cqk.data.prepare_worker import WorkerSettings, raise_worker_error, stop_processes, tokenize_unit
from lightning_cqk.data.sources import WorkUnit
from lightning_cqk.errors import ConfigError

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")  # litdata pings PyPI on import otherwise


def write_split(
    split: str,
    jobs: list[tuple[WorkUnit, str]],
    split_dir: Path,
    tmp: Path,
    settings: WorkerSettings,
    num_workers: int,
    chunk_bytes: str,
    explicit_val: bool,
) -> SplitStats:
    """Tokenize one split's work units into ``split_dir`` with litdata and return its checked counts."""
    from litdata import TokensLoader, optimize

    report_dir = tmp / "reports" / split
    report_dir.mkdir(parents=True)
    t0 = time.perf_counter()
    items = [(i, unit, keep) for i, (unit, keep) in enumerate(jobs)]
    fn = partial(tokenize_unit, settings=settings, report_dir=str(report_dir))
    with (
        _litdata_sandbox(tmp / "litdata" / split),
        watch_progress(report_dir, jobs, f"prepare {split}"),
        _stopping_leftover_processes(),
    ):
        try:
            optimize(
                fn=fn,
                inputs=items,
                output_dir=str(split_dir),
                chunk_bytes=chunk_bytes,
                item_loader=TokensLoader(),
                num_workers=min(num_workers, len(items)),
                mode="overwrite",
                reorder_files=False,
                keep_data_ordered=True,  # static in-order slices per worker: the same stream for any worker count
                start_method=start_method(),
                verbose=False,
            )
        except Exception:
            raise_worker_error(report_dir)  # a worker's own error (its type, its errno) explains litdata's wrapper
            raise
    raise_worker_error(report_dir)  # litdata misses a worker's error that comes after its last item's progress
    stats, seen = SplitStats(), 0
    reports = sorted(report_dir.glob("stats-*.json"))
    if len(reports) != len(items):
        raise RuntimeError(f"{split_dir}: {len(items)} work units were given to litdata but {len(reports)} reported.")
    for report in reports:
        data = json.loads(report.read_text())
        stats.add(SplitStats(**data["stats"]))
        seen += data["seen"]
    if stats.documents == 0:
        raise ConfigError(_empty_split_message(split, seen, settings.val_fraction, explicit_val))
    written = _tokens_in_index(split_dir)
    if written != stats.tokens:
        raise RuntimeError(f"{split_dir}: litdata's index.json holds {written} tokens but {stats.tokens} were written.")
    print(
        f"prepare: {split}: {stats.documents:,} documents, {stats.tokens:,} tokens, {stats.bytes / 1e6:.2f} MB "
        f"({time.perf_counter() - t0:.1f} s)."
    )
    return stats


def _empty_split_message(split: str, seen: int, val_fraction: float, explicit_val: bool) -> str:
    """Why a split came out empty, and what to change."""
    if explicit_val:
        which = "val_source" if split == "val" else "source"
        return f"The {split} split would be empty: {which} holds no documents (empty files or blank text)."
    if seen == 0:
        return "The source holds no documents (empty files or blank text)."
    fixes = (
        "Give more documents, split plain text into smaller documents (documents='paragraph' or 'line'), "
        f"{'raise' if split == 'val' else 'lower'} val_fraction, or give the validation text as val_source."
    )
    which = f"none of the {seen:,} documents" if split == "val" else f"all {seen:,} documents"
    return f"The {split} split would be empty: {which} hashed below val_fraction={val_fraction}. {fixes}"


def _tokens_in_index(split_dir: Path) -> int:
    """The tokens litdata's ``index.json`` of a split records (the sum of its chunks' lengths)."""
    index = json.loads((split_dir / "index.json").read_text())
    return sum(chunk["dim"] for chunk in index["chunks"])


def gather_digests(report_dir: Path, path: Path) -> str:
    """Merge the val workers' digest files into one sorted ``.npy``; return its path."""
    parts = [np.load(p) for p in sorted(report_dir.glob("digests-*.npy"))]
    np.save(path, np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.uint64))
    return str(path)


@contextmanager
def _stopping_leftover_processes() -> Iterator[None]:
    """On the way out, stop the processes started inside that still run.

    litdata leaves its workers running when it raises (a worker's error, or SIGTERM in this process); stopping them
    runs their exit path (``guard_litdata_worker``), which stops the helpers each one started.
    """
    before = {process.pid for process in multiprocessing.active_children()}
    try:
        yield
    finally:
        stop_processes([p for p in multiprocessing.active_children() if p.pid not in before])


def start_method() -> str:
    """fork on Linux: litdata's default, spawn, re-imports torch in every worker (seconds each) and re-runs a
    calling script that lacks an ``if __name__ == "__main__":`` guard. The workers only read files and tokenize,
    so forking is safe there. Elsewhere (macOS, Windows) fork is unsafe or missing, so keep spawn."""
    return "fork" if sys.platform.startswith("linux") else "spawn"


@contextmanager
def watch_progress(report_dir: Path, jobs: list[tuple[WorkUnit, str]], desc: str, interval: float = 0.5):
    """A progress bar (MB of text) on a terminal while litdata tokenizes; silent when stderr is not a TTY.

    Workers write one report per finished work unit (``stats-*`` or ``error-*``); a thread in the parent counts
    them, so nothing crosses the process boundary and litdata's own (noisy) output stays off.
    """
    from tqdm import tqdm

    sizes = {
        i: ((u.end if u.end is not None else Path(u.path).stat().st_size) - u.start) for i, (u, _) in enumerate(jobs)
    }
    bar = tqdm(total=round(sum(sizes.values()) / 1e6, 2), desc=desc, unit="MB", disable=None, leave=False)
    done: set[int] = set()
    stop = threading.Event()

    def poll() -> None:
        while True:
            finished = {int(p.stem.split("-")[1]) for p in report_dir.glob("*-*.json")} - done
            if finished:
                done.update(finished)
                bar.update(round(sum(sizes[i] for i in finished) / 1e6, 2))
            if stop.wait(interval):
                return

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield done
    finally:
        stop.set()
        thread.join()
        bar.close()


@contextmanager
def _litdata_sandbox(tmp: Path) -> Iterator[None]:
    """Run one ``optimize`` with private cache folders, then restore what it changes process-wide."""
    env_keys = ("DATA_OPTIMIZER_CACHE_FOLDER", "DATA_OPTIMIZER_DATA_CACHE_FOLDER", "DATA_OPTIMIZER_NUM_WORKERS")
    saved_env = {k: os.environ.get(k) for k in env_keys}
    saved_method = multiprocessing.get_start_method(allow_none=True)
    main_thread = threading.current_thread() is threading.main_thread()
    saved_sigint = signal.getsignal(signal.SIGINT) if main_thread else None
    os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = str(tmp / "chunks")
    os.environ["DATA_OPTIMIZER_DATA_CACHE_FOLDER"] = str(tmp / "data")
    try:
        yield
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        multiprocessing.set_start_method(saved_method, force=True)
        if main_thread and saved_sigint is not None:
            signal.signal(signal.SIGINT, saved_sigint)
