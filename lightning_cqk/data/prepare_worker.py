"""The worker side of ``prepare``: what runs inside litdata's worker processes, and what the parent reads back.

Each work unit is tokenized by ``tokenize_unit`` (litdata's ``fn``): the documents of the split it is asked for, each
followed by EOS, handed to litdata in arrays of about a million tokens. A worker never raises (a raising litdata
worker leaves orphaned grandchild processes and a wrapped traceback): it writes ``error-<index>.json`` and stops, and
the parent raises that error with its original type (``raise_worker_error``). Per unit it writes
``stats-<index>.json`` (the counts the parent adds up) and, on the val split of an explicit ``val_source`` with
``val_overlap="drop"``, ``digests-<index>.npy`` (the texts' digests the train split leaves out).

``guard_litdata_worker`` makes each worker record its chunk writer's errors (a full disk) and always exit (see its
docstring); ``stop_processes`` is how both sides stop processes.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import multiprocessing.util
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import wraps
from pathlib import Path

import numpy as np

from lightning_cqk.data.manifest import SplitStats
from lightning_cqk.data.sources import WorkUnit, iter_unit_documents
from lightning_cqk.data.tokenizers import get_tokenizer
from lightning_cqk.errors import ConfigError, MissingInputError, UnavailableError, storage_full_errno
from lightning_cqk.files.atomic import write_json_atomically

_FLUSH_TOKENS = 1 << 20  # tokens per array handed to litdata: per-item overhead is ~10 us, so batch documents


def in_val(text: str, val_fraction: float) -> bool:
    """The deterministic document-level split rule (True: the document belongs to val)."""
    digest = hashlib.blake2b(text.encode("utf-8")).hexdigest()
    return int(digest[:15], 16) / 16**15 < val_fraction


@dataclass(frozen=True)
class WorkerSettings:
    """What every worker needs besides its unit (pickled once per work item; small)."""

    tokenizer: str
    bpe_file: str | None
    val_fraction: float
    text_field: str
    documents: str
    dtype: str
    record_digests: bool = False  # write each kept document's text digest (the val split, to drop its copies)
    exclude_digests: str | None = None  # .npy of val digests: train documents with these are left out and counted


def _digest(text: str) -> int:
    """64-bit blake2b of a document's UTF-8 text: equal texts, equal digests (collisions ~ n^2 / 2^65)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


_DIGEST_CACHE: dict[str, frozenset[int]] = {}


def _excluded(path: str) -> frozenset[int]:
    """The val digests, loaded once per worker process."""
    if path not in _DIGEST_CACHE:
        _DIGEST_CACHE.clear()
        _DIGEST_CACHE[path] = frozenset(int(d) for d in np.load(path))
    return _DIGEST_CACHE[path]


def tokenize_unit(item: tuple[int, WorkUnit, str], settings: WorkerSettings, report_dir: str) -> Iterator[np.ndarray]:
    """litdata worker function: yield the tokens of one unit's documents that belong to this split.

    Never raises (see the module docstring): errors are written to ``error-<index>.json`` for the parent.
    """
    index, unit, keep = item
    reports = Path(report_dir)
    guard_litdata_worker(reports)
    if any(reports.glob("error-*.json")):
        return  # another unit failed; the run will be aborted, so stop spending time
    stats, seen = SplitStats(), 0
    pending: list[np.ndarray] = []
    n_pending = 0
    try:
        tok = get_tokenizer(settings.tokenizer, settings.bpe_file)
        dtype = np.dtype(settings.dtype)
        eos = np.array([tok.eos_id], dtype=dtype)
        exclude = _excluded(settings.exclude_digests) if settings.exclude_digests else None
        digests: list[int] | None = [] if settings.record_digests else None

        def skipped(where: str) -> None:
            if keep != "val":  # a hash split reads each unit twice: count in the train pass only
                stats.skipped_blank += 1
                stats.first_skipped = stats.first_skipped or where

        for doc in iter_unit_documents(unit, settings.text_field, settings.documents, on_skip=skipped):
            seen += 1
            try:
                if keep != "all" and in_val(doc.text, settings.val_fraction) != (keep == "val"):
                    continue
                if exclude is not None or digests is not None:
                    digest = _digest(doc.text)
                    if exclude is not None and digest in exclude:
                        stats.dropped_val_copies += 1
                        stats.dropped_val_copy_bytes += len(doc.text.encode("utf-8"))
                        stats.first_val_copy = stats.first_val_copy or doc.source
                        continue
                    if digests is not None:
                        digests.append(digest)
                ids = tok.encode_array(doc.text).astype(dtype, copy=False)
                size = len(doc.text.encode("utf-8"))
            except Exception as err:  # name the document: a worker's error has no other context
                raise (
                    type(err)(f"{doc.source}: {err}")
                    if isinstance(err, (ValueError, RuntimeError))
                    else ValueError(f"{doc.source}: cannot tokenize this document ({type(err).__name__}: {err}).")
                ) from err
            first = doc.source if doc.replaced or doc.surrogates else ""
            stats.add(SplitStats(1, len(ids) + 1, size, doc.replaced, doc.surrogates, first))
            pending += [ids, eos]
            n_pending += len(ids) + 1
            if n_pending >= _FLUSH_TOKENS:
                yield np.concatenate(pending)
                pending, n_pending = [], 0
        if pending:
            yield np.concatenate(pending)
    except Exception as err:  # reported to the parent, which raises it with its original type
        write_json_atomically(reports / f"error-{index:06d}.json", {"type": type(err).__name__, "message": str(err)})
        return
    if digests is not None:
        np.save(reports / f"digests-{index:06d}.npy", np.array(digests, dtype=np.uint64))
    write_json_atomically(reports / f"stats-{index:06d}.json", {"stats": asdict(stats), "seen": seen})


_RERAISABLE = {
    cls.__name__: cls
    for cls in (ValueError, FileNotFoundError, PermissionError, OSError, RuntimeError)
    + (ConfigError, MissingInputError, UnavailableError)  # user errors stay user errors: they print alone
}


def raise_worker_error(report_dir: Path) -> None:
    """Raise the first error a worker recorded: a work unit's (``error-*``), else the chunk writer's."""
    errors = sorted(report_dir.glob("error-*.json"))
    if errors:
        error = json.loads(errors[0].read_text())
        raise _RERAISABLE.get(error["type"], RuntimeError)(error["message"])
    writer_errors = sorted(report_dir.glob(f"{_WRITER_ERROR}*.json"))
    if writer_errors:
        error = json.loads(writer_errors[0].read_text())
        if error.get("errno") is not None:
            raise OSError(error["errno"], os.strerror(error["errno"]), error.get("filename"))
        raise RuntimeError(f"litdata's chunk writer failed in a worker: {error['type']}: {error['message']}")


_WRITER_ERROR = "writer_error_"  # + pid; no "-" in it: watch_progress counts the "<kind>-<index>.json" reports
_GUARDED_PID: int | None = None


def guard_litdata_worker(report_dir: Path) -> None:
    """In a litdata worker process, once: record its chunk writer's errors, and let it always exit.

    litdata's worker writes the chunks itself (``cache._add_item`` per item, ``cache.done()`` for the last chunk
    and its index) and reports a failure only as text on a queue that its parent stops reading once every item is
    counted, so a full disk during the last write went unseen: the failure is recorded here, with its errno, for
    ``raise_worker_error``. And it stops the helper process it starts (a remover) only when its loop finishes, so
    a worker that failed waited at exit for that helper for ever, and the parent joining the worker with it (the
    hang on a full disk): at exit, the helpers still running are stopped. SIGTERM (the parent stopping it) exits
    through the same path, so a stopped worker leaves no orphan either.
    """
    global _GUARDED_PID
    if _GUARDED_PID == os.getpid() or multiprocessing.parent_process() is None:
        return
    _GUARDED_PID = os.getpid()
    cache = getattr(multiprocessing.current_process(), "cache", None)
    for name in ("_add_item", "done"):
        if callable(getattr(cache, name, None)):
            setattr(cache, name, _recording_errors(getattr(cache, name), report_dir))
    multiprocessing.util.Finalize(None, stop_processes, args=(None,), exitpriority=50)  # before children are joined
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _recording_errors(write, report_dir: Path):
    """``write``, recording any error it raises in ``report_dir`` (best effort: a full disk may refuse that too)."""

    @wraps(write)
    def recorded(*args, **kwargs):
        try:
            return write(*args, **kwargs)
        except Exception as err:
            code = storage_full_errno(err) or getattr(err, "errno", None)
            error = {"type": type(err).__name__, "message": str(err), "errno": code}
            error["filename"] = getattr(err, "filename", None)
            try:
                write_json_atomically(report_dir / f"{_WRITER_ERROR}{os.getpid()}.json", error)
            except OSError:
                pass
            raise

    return recorded


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # through multiprocessing's exit path: the Finalize above stops the helpers


def stop_processes(processes: list | None, timeout: float = 10.0) -> None:
    """Stop ``processes`` (None: this process's children still running): SIGTERM, then SIGKILL after ``timeout``."""
    processes = multiprocessing.active_children() if processes is None else processes
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()
