"""Text -> litdata token shards: ``lightning_cqk prepare`` and the DataModule's ``prepare_data``.

Layout of an output directory::

    <output_dir>/train/          litdata chunks + index.json (TokensLoader format: one flat token array per chunk)
    <output_dir>/val/
    <output_dir>/manifest.json   written last, atomically; its presence means "finished"

Every document's tokens are followed by EOS. Tokens are stored as uint16 when every id fits (bytes, GPT-2), else
int32; litdata records the dtype in ``index.json`` and ``TokensLoader`` reads it back as written.

**Split.** By document and deterministic: a document is in val when
``int(blake2b(utf8(text)).hexdigest()[:15], 16) / 16**15 < val_fraction``. It depends only on the text, so identical
documents share a split and neither file order nor worker count matters. With ``val_source``, all of ``source`` is
train and all of ``val_source`` is val.

**Parallelism.** Files are cut into work units (whole files, or byte ranges of big files at document boundaries)
that ``num_workers`` processes tokenize. litdata keeps the units in order (``keep_data_ordered``), so the token
stream of a split is the same for any worker count; only chunk boundaries move. Each unit writes its counts to a
small JSON file that the parent adds up and checks against the token counts in litdata's ``index.json``.

**One writer** (``folder_lock.py``). A local ``prepare`` holds ``<output_dir>/.data.lock`` exclusively while it
downloads, tokenizes and swaps in the new build; a second ``prepare`` into the folder waits for it and then reuses
its build when that is what it asks for (with ``overwrite`` too: that build is newer than the request), so two
concurrent prepares (or every node of a multi-node job preparing one shared ``data_dir``) leave one intact build. A
folder that live runs read is never rebuilt: the prepare is refused, naming them. The new build is written beside the
old one (``.prepare-*``), tagged with a build id (``manifest.extra.build_id`` and ``<split>/.build_id``), and swapped
in manifest last (the old manifest is removed first), so a manifest never describes another build's shards.

**Reuse.** A finished directory is reused when asked for again with the same tokenizer, files and settings
(``request.py``, the comparison the DataModules run too); asked for with different ones it raises (pass
``overwrite=True`` to rebuild). A directory without a manifest (an interrupted run) is rebuilt from scratch. A
rebuild replaces only what prepare wrote: a ``train/`` or ``val/`` that is not a litdata split folder is refused.

**Nothing left out silently.** Files under the source that cannot be read (unsupported types) are listed and
refused when they hold most of its bytes; a corpus's left-out files are counted (``corpora.py``); with explicit
validation text, training documents identical to a validation document are dropped (``val_overlap="drop"``) and
counted. All of it is printed and recorded in the manifest's ``left_out``.

**litdata side effects we undo.** ``optimize`` sets the process-wide multiprocessing start method, replaces the
SIGINT handler, sets ``DATA_OPTIMIZER_NUM_WORKERS`` and deletes ``$TMPDIR/chunks`` and ``$TMPDIR/data`` (shared by
every concurrent ``optimize``); each call here runs with private cache folders and restores the rest. A worker that
raises leaves orphaned grandchild processes and a wrapped traceback, so workers never raise: they record the error
and stop, and the parent raises it with its original type.

**A build that cannot finish** (``_guard_litdata_worker``). litdata's own chunk writes can fail too (a full disk,
a quota, a file-size limit): each worker records its writer's error with its errno, stops at exit the helper
process litdata started in it (else the worker, and the parent joining it, waited for ever), and the parent stops
any worker still running when ``optimize`` ends. Such a build raises ``StorageFullError`` (one paragraph: what
failed, that the previous build is unchanged, how to make room); the new manifest is written into the build before
the swap, which only unlinks and renames, so a full disk never leaves the old build half replaced. A SIGTERM during
the build or the wait for the lock (``folder_lock.ending_cleanly_on_sigterm``) stops the workers, removes the
partial build and releases the lock before the process exits with status 143.
"""

from __future__ import annotations

import errno
import hashlib
import json
import multiprocessing
import multiprocessing.util
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from functools import partial, wraps
from pathlib import Path

import numpy as np

from lightning_cqk.atomic_files import write_json_atomically
from lightning_cqk.data import remote
from lightning_cqk.data.builtin import BUILTIN_CORPORA
from lightning_cqk.data.folder_lock import Terminated, ending_cleanly_on_sigterm, hold_for_reading, writing
from lightning_cqk.data.integrity import BUILD_FILE
from lightning_cqk.data.manifest import MANIFEST_NAME, Manifest, SplitStats
from lightning_cqk.data.request import (
    VAL_OVERLAP,
    SourceFile,
    build_request,
    describe,
    differences,
    file_entries,
    fingerprint_of,
    owned_split_dir,
)
from lightning_cqk.data.sources import (
    WorkUnit,
    check_documents_mode,
    iter_unit_documents,
    plan_work_units,
    unsupported_entries,
)
from lightning_cqk.data.tokenizers import get_tokenizer, token_dtype
from lightning_cqk.errors import (
    ConfigError,
    MissingInputError,
    StorageFullError,
    UnavailableError,
    storage_full_errno,
)

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")  # litdata pings PyPI on import otherwise

_FLUSH_TOKENS = 1 << 20  # tokens per array handed to litdata: per-item overhead is ~10 us, so batch documents
_MIN_UNIT_BYTES = 256 << 10
_MAX_UNIT_BYTES = 64 << 20


def in_val(text: str, val_fraction: float) -> bool:
    """The deterministic document-level split rule (True: the document belongs to val)."""
    digest = hashlib.blake2b(text.encode("utf-8")).hexdigest()
    return int(digest[:15], 16) / 16**15 < val_fraction


def prepare(
    source: str | list[str] | None,
    output_dir: str,
    tokenizer: str = "bytes",
    bpe_file: str | None = None,
    val_fraction: float = 0.05,
    val_source: str | list[str] | None = None,
    text_field: str = "text",
    documents: str = "file",
    num_workers: int = 1,
    chunk_bytes: str = "64MB",
    overwrite: bool = False,
    corpus: str | None = None,
    max_documents: int | None = None,
    other_files: str = "refuse",
    val_overlap: str = "drop",
) -> Manifest:
    """Tokenize text into litdata token shards with a train/val split and a manifest.

    Args:
        source: text file, directory (recursive), glob, or a list of them, of .txt/.md/.raw/.text (plain text) or
            .jsonl/.json (JSON lines) files, or a built-in corpus such as ``builtin:python_docs``.
        output_dir: directory that receives ``train/``, ``val/`` and ``manifest.json``; an ``s3://bucket/prefix`` is
            prepared locally and uploaded (manifest last; see ``remote.py``).
        tokenizer: ``bytes`` or ``gpt2``.
        bpe_file: local GPT-2 ``.tiktoken`` file for offline use (default: $LIGHTNING_CQK_GPT2_BPE).
        val_fraction: fraction of documents (chosen by a hash of their text) that go to the validation split.
        val_source: separate validation text (same forms as ``source``); then all of ``source`` is train.
        text_field: JSON field that holds the text in JSON-lines files.
        documents: what one document is in plain-text files: ``file``, ``paragraph`` (blank-line separated) or
            ``line``. JSON lines always give one document per line.
        num_workers: processes that tokenize in parallel.
        chunk_bytes: size of a litdata chunk, e.g. ``64MB``.
        overwrite: rebuild even when finished shards exist (also allows another tokenizer, source or setting).
        corpus: a named corpus (``corpora.CORPORA``: ``wikitext103``, ``pubmed``, ``c4``, ...). Then ``source`` is a
            local copy in the corpus's own format (its train/valid files become the splits, see ``corpora.py``) and
            ``documents``/``text_field`` come from the corpus; with ``source`` None it is downloaded into
            ``<output_dir>/raw/`` (needs the ``datasets`` package and a network).
        max_documents: with a download, keep at most this many rows of each online split.
        other_files: with a corpus whose files name their splits, what to do with files that name none
            (``corpora.OTHER_FILES``): ``refuse`` (default: stop and show the counts), ``train``, ``hash`` (ignore the
            file names, split every non-test file by document hash) or ``leave_out``.
        val_overlap: with explicit validation text (``val_source``, or a corpus's own val files), what to do with
            training documents whose text equals a validation document's: ``drop`` (default: leave them out of
            train, counted in the manifest's ``left_out`` and printed; training on validation text makes the
            validation loss a lie) or ``keep``. A hash split never overlaps (equal texts share a split).

    Returns:
        The manifest of the new or reused shards.

    Raises:
        FileNotFoundError: a source path does not exist.
        ValueError: bad settings, a mismatching existing directory, or a split that would be empty.
        folder_lock.DataFolderInUse: a rebuild of a folder that live runs read; the message names them.
    """
    args = dict(
        source=source, output_dir=output_dir, tokenizer=tokenizer, bpe_file=bpe_file, val_fraction=val_fraction,
        val_source=val_source, text_field=text_field, documents=documents, num_workers=num_workers,
        chunk_bytes=chunk_bytes, corpus=corpus, max_documents=max_documents, other_files=other_files,
        val_overlap=val_overlap,
    )  # fmt: skip
    if remote.is_remote(output_dir):  # no lock on object stores: uploaded manifest last (module docstring)
        return _prepare(**args, overwrite=overwrite)
    out = Path(output_dir).expanduser()
    with ending_cleanly_on_sigterm():  # a wait or a build stopped by SIGTERM unwinds: lock released, build removed
        if not overwrite and Manifest.exists(out):  # reuse (or refuse): a shared hold is enough; runs may read it
            hold = hold_for_reading(out)  # waits while another prepare rebuilds it
            try:
                if Manifest.exists(out):
                    return _prepare(**args, overwrite=False)
            finally:
                hold.release()
        with writing(out) as waited:
            return _prepare(**args, overwrite=overwrite, prefer_existing=waited)


def _prepare(
    source: str | list[str] | None,
    output_dir: str,
    tokenizer: str,
    bpe_file: str | None,
    val_fraction: float,
    val_source: str | list[str] | None,
    text_field: str,
    documents: str,
    num_workers: int,
    chunk_bytes: str,
    overwrite: bool,
    corpus: str | None,
    max_documents: int | None,
    other_files: str,
    val_overlap: str,
    prefer_existing: bool = False,
) -> Manifest:
    """``prepare`` once the folder is held (``prefer_existing``: reuse matching shards even with overwrite)."""
    left_out: list[dict] = []
    if max_documents is not None and not (corpus is not None and source is None):
        print(
            f"prepare: NOTE: max_documents={max_documents} is not applied: it takes the head of a corpus download "
            "(corpus set, source null), and this source is local."
        )
    if corpus is not None:
        from lightning_cqk.data.corpora import resolve_corpus

        if val_source is not None:
            raise ConfigError(f"corpus={corpus!r} takes its validation split from its own files; drop val_source.")
        raw = Path(output_dir).expanduser() / "raw"
        resolved = resolve_corpus(
            corpus, source, download_dir=raw, max_documents=max_documents, other_files=other_files, overwrite=overwrite
        )
        source, val_source = resolved.source, resolved.val_source
        documents, text_field = resolved.documents, resolved.text_field
        left_out = resolved.left_out_entries()
        print(resolved.summary())
    elif source is None:
        raise ConfigError("prepare needs a source (text files) or a corpus name (see lightning_cqk.data.corpora).")
    kwargs = dict(
        tokenizer=tokenizer,
        bpe_file=bpe_file,
        val_fraction=val_fraction,
        val_source=val_source,
        text_field=text_field,
        documents=documents,
        num_workers=num_workers,
        chunk_bytes=chunk_bytes,
        overwrite=overwrite,
        corpus=corpus,
        left_out=left_out,
        val_overlap=val_overlap,
    )
    if remote.is_remote(output_dir):
        return _prepare_remote(source, output_dir, **kwargs)
    return _prepare_local(source, output_dir, prefer_existing=prefer_existing, **kwargs)


def _prepare_local(
    source: str | list[str],
    output_dir: str,
    tokenizer: str,
    bpe_file: str | None,
    val_fraction: float,
    val_source: str | list[str] | None,
    text_field: str,
    documents: str,
    num_workers: int,
    chunk_bytes: str,
    overwrite: bool,
    corpus: str | None,
    left_out: list[dict],
    val_overlap: str = "drop",
    shown_as: str | None = None,
    prefer_existing: bool = False,
) -> Manifest:
    """``prepare`` into a local directory, once a corpus (if any) is resolved into plain sources.

    ``shown_as``: the directory's name in messages (the ``s3://`` URL when this is the local build of an upload).
    ``prefer_existing``: finished shards that match the request are reused even with ``overwrite`` (they were built
    by the prepare this one waited for).
    """
    check_documents_mode(documents)
    if val_overlap not in VAL_OVERLAP:
        raise ConfigError(f"val_overlap={val_overlap!r} is not one of {', '.join(map(repr, VAL_OVERLAP))}.")
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError(f"val_fraction must be in [0, 1), got {val_fraction}.")
    if val_source is None and val_fraction == 0.0:
        raise ConfigError("val_fraction=0 leaves the validation split empty; give val_source or a fraction > 0.")
    num_workers = max(1, int(num_workers))
    out = Path(output_dir).expanduser()
    fingerprint = fingerprint_of(tokenizer, bpe_file)
    request = build_request(
        source, tokenizer, fingerprint, val_fraction, val_source, text_field, documents, corpus, val_overlap=val_overlap
    )
    train_files, val_files = request.train_files, request.val_files

    if Manifest.exists(out) and (not overwrite or prefer_existing):
        manifest = Manifest.load(out)
        differ = differences(manifest, request)
        if differ and not overwrite:
            raise ConfigError(
                f"{shown_as or out} holds shards made from {describe(manifest)}, with other settings than asked now "
                f"({'; '.join(differ)}). "
                "Prepare into another output_dir, or pass overwrite=True (CLI: --overwrite true) to rebuild it."
            )
        if not differ:
            built = " (just built by the prepare this one waited for)" if prefer_existing else ""
            print(
                f"prepare: reusing finished shards at {shown_as or out}{built} "
                f"({manifest.splits['train'].tokens:,} train tokens)."
            )
            return manifest
    unsupported = unsupported_entries(request.sources + (request.val_sources or []))
    _check_unsupported(unsupported, request)
    left_out = left_out + unsupported
    tok = get_tokenizer(tokenizer, bpe_file)  # loads the vocabulary now: a missing BPE file fails before any work
    for split in ("train", "val"):
        if not owned_split_dir(out / split):
            raise ConfigError(
                f"{out / split} is not a token-shard folder written by lightning_cqk (no litdata index.json, and it "
                "holds other files), so prepare will not replace it: a rebuild deletes only what prepare wrote. "
                "Prepare into another output_dir, or move that folder away."
            )
    if (out / "train").exists() or (out / "val").exists():
        why = "overwrite=True" if Manifest.exists(out) else "no manifest.json, so an earlier run did not finish"
        print(f"prepare: rebuilding {out} ({why}).")
    out.mkdir(parents=True, exist_ok=True)
    for leftover in out.glob(".prepare-*"):  # from a prepare that was killed: this one holds the folder's lock
        shutil.rmtree(leftover, ignore_errors=True)

    start = time.perf_counter()
    dtype = token_dtype(tok.vocab_size)
    # Build beside the old shards and swap at the end, so a failed rebuild leaves a finished directory intact.
    with _failures_explained(out, chunk_bytes), _new_build_beside(out) as build:
        with tempfile.TemporaryDirectory(prefix="lightning_cqk_prepare_") as tmp_name:
            tmp = Path(tmp_name)
            train_paths = _materialise(train_files, tmp / "train_src", num_workers)
            val_paths = _materialise(val_files, tmp / "val_src", num_workers)
            gathered = time.perf_counter()
            total = sum(p.stat().st_size for p in train_paths + val_paths)
            target = min(max(total // (num_workers * 4), _MIN_UNIT_BYTES), _MAX_UNIT_BYTES)
            train_units = plan_work_units(train_paths, documents, target)
            val_units = plan_work_units(val_paths, documents, target)
            print(
                f"prepare: {len(train_files) + len(val_files)} source(s), {total / 1e6:.2f} MB -> "
                f"{len(train_units) + len(val_units)} work units on {num_workers} worker(s), tokenizer {tokenizer!r}."
            )
            settings = _Settings(tokenizer, bpe_file, val_fraction, text_field, documents, dtype.name)
            # val first: it is small, so a split that comes out empty fails fast, not after tokenizing train.
            val_sources = request.val_sources
            explicit = val_sources is not None
            if not explicit:
                jobs = {"val": [(u, "val") for u in train_units], "train": [(u, "train") for u in train_units]}
            else:
                jobs = {"val": [(u, "all") for u in val_units], "train": [(u, "all") for u in train_units]}
            drop = explicit and val_overlap == "drop"  # (a hash split cannot overlap: equal texts share a split)
            val_settings = replace(settings, record_digests=drop)
            stats = {
                "val": _write_split(
                    "val", jobs["val"], build / "val", tmp, val_settings, num_workers, chunk_bytes, explicit
                )
            }
            exclude = _gather_digests(tmp / "reports" / "val", tmp / "val_digests.npy") if drop else None
            train_settings = replace(settings, exclude_digests=exclude)
            stats["train"] = _write_split(
                "train", jobs["train"], build / "train", tmp, train_settings, num_workers, chunk_bytes, explicit
            )
        build_id = uuid.uuid4().hex
        for split in ("train", "val"):
            (build / split / BUILD_FILE).write_text(build_id + "\n")
        seconds = time.perf_counter() - start
        tokenize_seconds = time.perf_counter() - gathered
        import litdata

        manifest = Manifest(
            tokenizer=tokenizer,
            tokenizer_fingerprint=tok.fingerprint,
            vocab_size=tok.vocab_size,
            eos_id=tok.eos_id,
            dtype=dtype.name,
            splits={"train": stats["train"], "val": stats["val"]},
            sources=request.sources,
            val_sources=request.val_sources,
            files=file_entries(train_files + val_files),
            val_fraction=val_fraction,
            split_rule=request.split_rule,
            documents_mode=documents,
            text_field=text_field,
            litdata_version=litdata.__version__,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            seconds=round(seconds, 3),
            corpus=corpus,
            left_out=left_out + _val_copies_entry(stats["train"], val_overlap),
            val_overlap=val_overlap if request.val_sources is not None else "n/a",
            extra={"build_id": build_id},
        )
        manifest.save(build)  # written beside the shards while the old build stands: the swap only renames
        _swap_in(build, out)
    _report(out, manifest, seconds, tokenize_seconds, num_workers)
    return manifest


@contextmanager
def _new_build_beside(out: Path) -> Iterator[Path]:
    """A fresh ``<out>/.prepare-*`` folder for the new build, removed on the way out however the build ends."""
    build = Path(tempfile.mkdtemp(prefix=".prepare-", dir=out))
    try:
        yield build
    finally:
        shutil.rmtree(build, ignore_errors=True)


@contextmanager
def _failures_explained(out: Path, chunk_bytes: str) -> Iterator[None]:
    """A build stopped by SIGTERM says what is left; one that ran out of space raises ``StorageFullError``.

    Entered outside ``_new_build_beside``, so both speak once the partial build is gone.
    """
    try:
        yield
    except Terminated:
        print(f"prepare: stopped by SIGTERM; the partial build is removed and {_previous_build(out)}.", flush=True)
        raise
    except Exception as err:
        code = storage_full_errno(err)
        if code is None:
            raise
        raise StorageFullError(code, str(out), _storage_full_message(code, out, chunk_bytes)) from err


def _swap_in(build: Path, out: Path) -> None:
    """Replace the build in ``out`` by ``build``: the old manifest first (never beside new shards), the new one last.

    Only unlinks and renames: nothing here needs free space, so a full disk fails before it, with the old build whole.
    """
    for stale in (out / MANIFEST_NAME, out / "train", out / "val"):
        if stale.is_dir():
            shutil.rmtree(stale)
        else:
            stale.unlink(missing_ok=True)
    for split in ("train", "val"):
        os.replace(build / split, out / split)  # index.json names its chunks relative to its folder
    os.replace(build / MANIFEST_NAME, out / MANIFEST_NAME)


def _previous_build(out: Path) -> str:
    """What ``out`` holds after a failed or stopped build, for the message."""
    if Manifest.exists(out):
        return f"the previous build in {out} is unchanged (its manifest.json and shards were not touched)"
    return f"{out} holds no finished build (there was none before this prepare)"


def _storage_full_message(code: int, out: Path, chunk_bytes: str) -> str:
    """One paragraph: what failed, what is left as it was, and how to make room (every step works when pasted)."""
    usage = shutil.disk_usage(out)
    said = f"{os.strerror(code)} (errno {code}, {errno.errorcode.get(code, '?')})"
    if code == errno.EFBIG:
        fix = (
            f"A file-size limit (`ulimit -f`) is below one shard file (chunk_bytes={chunk_bytes}): raise the limit "
            "(`ulimit -f unlimited`) or pass a smaller --chunk_bytes (e.g. --chunk_bytes 8MB), then run the same "
            "command again."
        )
    else:
        fix = (
            f"The new build does not fit in the {usage.free / 1e6:,.1f} MB free there (the old build stays until the "
            f"new one is complete, so both must fit at once). Free space on that disk (`df -h {out}` shows it) and "
            "run the same command again, or prepare into a folder on a disk with room (--output_dir <new folder>) "
            "and point runs at it (fit: --data.data_dir <new folder>)."
        )
    return (
        f"{said} while writing the new token shards of {out}. The partial build is removed and "
        f"{_previous_build(out)}. {fix}"
    )


def _prepare_remote(source: str | list[str], output_dir: str, overwrite: bool, **kwargs) -> Manifest:
    """Prepare into a local folder and upload it to ``output_dir`` (``s3://``), the manifest last.

    A finished remote prepare is reused (or refused, if made with other settings) exactly like a local one: its
    manifest is fetched into the local folder first, so the same reuse check runs.
    """
    with tempfile.TemporaryDirectory(prefix="lightning_cqk_upload_") as tmp:
        local = Path(tmp)
        if Manifest.exists(output_dir) and not overwrite:
            (local / MANIFEST_NAME).write_text(remote.read_text(remote.join(output_dir, MANIFEST_NAME)))
        manifest = _prepare_local(source, str(local), overwrite=overwrite, shown_as=output_dir, **kwargs)
        if (local / "train").is_dir():  # built here, not reused
            start = time.perf_counter()
            sent = remote.upload_dir(local, output_dir, last=(MANIFEST_NAME,))
            seconds = time.perf_counter() - start
            print(f"prepare: uploaded {sent / 1e6:.2f} MB to {output_dir} in {seconds:.1f} s.")
        return manifest


def _check_unsupported(unsupported: list[dict], request) -> None:
    """Say which files under the source are not read; refuse when they hold most of its bytes."""
    if not unsupported:
        return
    used = sum(size for _, _, size in request.files or [] if isinstance(size, int))
    skipped = sum(e["bytes"] for e in unsupported)
    shown = "; ".join(f"{e['path']} ({e['bytes'] / 1e6:.2f} MB)" for e in unsupported[:5])
    more = f" and {len(unsupported) - 5} more" if len(unsupported) > 5 else ""
    if skipped > used:
        raise ConfigError(
            f"Most of the source is in files prepare cannot read: {len(unsupported)} file(s), {skipped / 1e6:.2f} MB "
            f"({shown}{more}), against {used / 1e6:.2f} MB of readable text. Decompress or convert them to "
            ".txt/.md/.raw/.text or .jsonl/.json, or give as source only the files you mean (e.g. a glob such as "
            "'folder/**/*.jsonl')."
        )
    print(f"prepare: LEFT OUT: {len(unsupported)} file(s) of unsupported type, {skipped / 1e6:.2f} MB: {shown}{more}.")


@dataclass(frozen=True)
class _Settings:
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


def _gather_digests(report_dir: Path, path: Path) -> str:
    """Merge the val workers' digest files into one sorted ``.npy``; return its path."""
    parts = [np.load(p) for p in sorted(report_dir.glob("digests-*.npy"))]
    np.save(path, np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.uint64))
    return str(path)


_DIGEST_CACHE: dict[str, frozenset[int]] = {}


def _excluded(path: str) -> frozenset[int]:
    """The val digests, loaded once per worker process."""
    if path not in _DIGEST_CACHE:
        _DIGEST_CACHE.clear()
        _DIGEST_CACHE[path] = frozenset(int(d) for d in np.load(path))
    return _DIGEST_CACHE[path]


def _materialise(files: list[SourceFile], tmp: Path, num_workers: int) -> list[Path]:
    """Paths to read; built-in corpora are first gathered (in parallel) into several small JSON-lines files."""
    paths: list[Path] = []
    for f in files:
        if f.builtin is None:
            paths.append(f.path)
            continue
        tmp.mkdir(parents=True, exist_ok=True)
        parts = [(f.builtin, i, num_workers * 4) for i in range(num_workers * 4)]
        if num_workers == 1:
            texts = [_gather_builtin(part) for part in parts]
        else:  # parsing the standard library with ast takes seconds: spread it over the workers
            with multiprocessing.get_context(_start_method()).Pool(num_workers) as pool:
                texts = pool.map(_gather_builtin, parts)
        for i, part_texts in enumerate(texts):
            path = tmp / f"{f.builtin}-{i:05d}.jsonl"
            path.write_text("".join(json.dumps({"text": text}) + "\n" for text in part_texts), encoding="utf-8")
            paths.append(path)
    return paths


def _gather_builtin(part: tuple[str, int, int]) -> list[str]:
    name, index, count = part
    return [doc.text for doc in BUILTIN_CORPORA[name](part=index, num_parts=count)]


def _write_split(
    split: str,
    jobs: list[tuple[WorkUnit, str]],
    split_dir: Path,
    tmp: Path,
    settings: _Settings,
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
    fn = partial(_tokenize_unit, settings=settings, report_dir=str(report_dir))
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
                start_method=_start_method(),
                verbose=False,
            )
        except Exception:
            _raise_worker_error(report_dir)  # a worker's own error (its type, its errno) explains litdata's wrapper
            raise
    _raise_worker_error(report_dir)  # litdata misses a worker's error that comes after its last item's progress
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
    index = json.loads((split_dir / "index.json").read_text())
    return sum(chunk["dim"] for chunk in index["chunks"])


def _tokenize_unit(item: tuple[int, WorkUnit, str], settings: _Settings, report_dir: str) -> Iterator[np.ndarray]:
    """litdata worker function: yield the tokens of one unit's documents that belong to this split.

    Never raises (see the module docstring): errors are written to ``error-<index>.json`` for the parent.
    """
    index, unit, keep = item
    reports = Path(report_dir)
    _guard_litdata_worker(reports)
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


def _raise_worker_error(report_dir: Path) -> None:
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


# ------------------------------------------------------------------------------------------- litdata workers
_WRITER_ERROR = "writer_error_"  # + pid; no "-" in it: watch_progress counts the "<kind>-<index>.json" reports
_GUARDED_PID: int | None = None


def _guard_litdata_worker(report_dir: Path) -> None:
    """In a litdata worker process, once: record its chunk writer's errors, and let it always exit.

    litdata's worker writes the chunks itself (``cache._add_item`` per item, ``cache.done()`` for the last chunk
    and its index) and reports a failure only as text on a queue that its parent stops reading once every item is
    counted, so a full disk during the last write went unseen: the failure is recorded here, with its errno, for
    ``_raise_worker_error``. And it stops the helper process it starts (a remover) only when its loop finishes, so
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
    multiprocessing.util.Finalize(None, _stop_processes, args=(None,), exitpriority=50)  # before children are joined
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


def _stop_processes(processes: list | None, timeout: float = 10.0) -> None:
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


@contextmanager
def _stopping_leftover_processes() -> Iterator[None]:
    """On the way out, stop the processes started inside that still run.

    litdata leaves its workers running when it raises (a worker's error, or SIGTERM in this process); stopping them
    runs their exit path (``_guard_litdata_worker``), which stops the helpers each one started.
    """
    before = {process.pid for process in multiprocessing.active_children()}
    try:
        yield
    finally:
        _stop_processes([p for p in multiprocessing.active_children() if p.pid not in before])


def _start_method() -> str:
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


def _val_copies_entry(train: SplitStats, val_overlap: str) -> list[dict]:
    """The manifest's ``left_out`` entry for training documents dropped as copies of validation documents."""
    if not train.dropped_val_copies:
        return []
    return [
        {
            "path": f"training documents identical to a validation document (first: {train.first_val_copy})",
            "reason": f"val_overlap={val_overlap}: a copy of validation text is not trained on",
            "documents": train.dropped_val_copies,
            "bytes": train.dropped_val_copy_bytes,
        }
    ]


def _report(out: Path, manifest: Manifest, seconds: float, tokenize_seconds: float, num_workers: int) -> None:
    train, val = manifest.splits["train"], manifest.splits["val"]
    text_mb = (train.bytes + val.bytes) / 1e6
    tokens = train.tokens + val.tokens
    print(
        f"prepare: wrote {out}: train {train.documents:,} docs / {train.tokens:,} tokens, val {val.documents:,} docs "
        f"/ {val.tokens:,} tokens, {text_mb:.2f} MB of text."
    )
    # Reading, splitting, tokenizing and writing; gathering a built-in corpus (parsing sources) is reported apart.
    print(
        f"prepare: tokenized at {text_mb / tokenize_seconds:.2f} MB/s, {tokens / tokenize_seconds:,.0f} tokens/s "
        f"({tokenize_seconds:.1f} s, {num_workers} worker{'s' if num_workers > 1 else ''}); "
        f"{seconds:.1f} s in all."
    )
    replaced = train.replaced_bytes + val.replaced_bytes
    surrogates = train.replaced_surrogates + val.replaced_surrogates
    first = val.first_replaced or train.first_replaced
    if replaced:
        print(f"prepare: {replaced:,} bytes that were not UTF-8 were replaced with U+FFFD (first in {first}).")
    if surrogates:
        print(
            f"prepare: {surrogates:,} lone surrogate escapes in JSON text (\\ud800-\\udfff without a pair: not a "
            f"character) were replaced with U+FFFD (first in {first})."
        )
    blank = train.skipped_blank + val.skipped_blank
    if blank:
        first = val.first_skipped or train.first_skipped
        print(
            f"prepare: LEFT OUT: {blank:,} records or files with blank or null text (first: {first}); check text_field "
            f"if that is more than expected ({train.documents + val.documents:,} documents were used)."
        )
    if train.dropped_val_copies:
        print(
            f"prepare: {train.dropped_val_copies:,} training documents are identical to validation documents and were "
            f"left out of train (first: {train.first_val_copy}); val_overlap='keep' keeps them."
        )
    data = [e for e in manifest.left_out if not e["reason"].startswith("documentation")]
    if data:
        docs = sum(e.get("documents") or 0 for e in data)
        print(
            f"prepare: LEFT OUT: {len(data)} file(s) or group(s) of the source, {docs:,} documents counted in them "
            f"({sum(e['bytes'] for e in data) / 1e6:.2f} MB), beside {train.documents + val.documents:,} documents "
            f"used; each is listed in {out / MANIFEST_NAME} (left_out) with the reason."
        )
