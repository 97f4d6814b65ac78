"""Text -> litdata token shards: ``lightning_cqk prepare`` and the DataModule's ``prepare_data``.

This file orchestrates: the options arrive as one ``PrepareSpec`` (``prepare_spec.py``); the folder is held, a corpus
resolved, the request compared with a finished build, the new build made beside the old one and swapped in. Each split
is tokenized by litdata in ``prepare_split.py`` (the parent's side) and ``prepare_worker.py`` (what runs in the
workers); ``prepare_report.py`` prints what was built.

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

**A build that cannot finish** (``prepare_worker.guard_litdata_worker``). litdata's own chunk writes can fail too
(a full disk, a quota, a file-size limit): each worker records its writer's error with its errno, stops at exit the
helper process litdata started in it (else the worker, and the parent joining it, waited for ever), and the parent stops
any worker still running when ``optimize`` ends. Such a build raises ``StorageFullError`` (one paragraph: what
failed, that the previous build is unchanged, how to make room); the new manifest is written into the build before
the swap, which only unlinks and renames, so a full disk never leaves the old build half replaced. A SIGTERM during
the build or the wait for the lock (``folder_lock.ending_cleanly_on_sigterm``) stops the workers, removes the
partial build and releases the lock before the process exits with status 143.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from lightning_cqk.data import remote
from lightning_cqk.data.builtin import BUILTIN_CORPORA
from lightning_cqk.data.folder_lock import Terminated, ending_cleanly_on_sigterm, hold_for_reading, writing
from lightning_cqk.data.integrity import BUILD_FILE
from lightning_cqk.data.manifest import MANIFEST_NAME, Manifest, SplitStats
from lightning_cqk.data.prepare_report import print_report
from lightning_cqk.data.prepare_spec import PrepareSpec
from lightning_cqk.data.prepare_split import gather_digests, start_method, watch_progress, write_split
from lightning_cqk.data.prepare_worker import WorkerSettings, in_val
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
from lightning_cqk.data.sources import check_documents_mode, plan_work_units, unsupported_entries
from lightning_cqk.data.tokenizers import get_tokenizer, token_dtype
from lightning_cqk.errors import ConfigError, StorageFullError, storage_full_errno

# in_val (prepare_worker.py) and watch_progress (prepare_split.py) stay importable from here, where they used to live.
__all__ = ["PrepareSpec", "in_val", "prepare", "prepare_shards", "watch_progress"]

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")  # litdata pings PyPI on import otherwise

_MIN_UNIT_BYTES = 256 << 10
_MAX_UNIT_BYTES = 64 << 20


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

    Its arguments are flat on purpose: they are the flags of ``lightning_cqk prepare`` (``cli/main.py`` reads this
    signature); they become one ``PrepareSpec``, which ``prepare_shards`` takes (as the DataModules call it).

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
    spec = PrepareSpec(
        source=source, output_dir=output_dir, tokenizer=tokenizer, bpe_file=bpe_file, val_fraction=val_fraction,
        val_source=val_source, text_field=text_field, documents=documents, num_workers=num_workers,
        chunk_bytes=chunk_bytes, overwrite=overwrite, corpus=corpus, max_documents=max_documents,
        other_files=other_files, val_overlap=val_overlap,
    )  # fmt: skip
    return prepare_shards(spec)


def prepare_shards(spec: PrepareSpec) -> Manifest:
    """``prepare`` of a ``PrepareSpec``: the folder held (one writer, readers waited for), then built or reused.

    Args and Returns: as ``prepare``'s, whose arguments are the spec's fields.
    """
    if remote.is_remote(spec.output_dir):  # no lock on object stores: uploaded manifest last (module docstring)
        return _prepare(spec)
    out = Path(spec.output_dir).expanduser()
    with ending_cleanly_on_sigterm():  # a wait or a build stopped by SIGTERM unwinds: lock released, build removed
        if not spec.overwrite and Manifest.exists(out):  # reuse (or refuse): a shared hold is enough; runs may read it
            hold = hold_for_reading(out)  # waits while another prepare rebuilds it
            try:
                if Manifest.exists(out):
                    return _prepare(spec)
            finally:
                hold.release()
        with writing(out) as waited:
            return _prepare(spec, prefer_existing=waited)


def _prepare(spec: PrepareSpec, prefer_existing: bool = False) -> Manifest:
    """``prepare`` once the folder is held: a named corpus resolved (or downloaded) into plain files, then built
    locally or for an upload (``prefer_existing``: reuse matching shards even with overwrite)."""
    left_out: list[dict] = []
    if spec.max_documents is not None and not (spec.corpus is not None and spec.source is None):
        print(
            f"prepare: NOTE: max_documents={spec.max_documents} is not applied: it takes the head of a corpus "
            "download (corpus set, source null), and this source is local."
        )
    if spec.corpus is not None:
        from lightning_cqk.data.corpora import resolve_corpus

        if spec.val_source is not None:
            raise ConfigError(f"corpus={spec.corpus!r} takes its validation split from its own files; drop val_source.")
        resolved = resolve_corpus(
            spec.corpus,
            spec.source,
            download_dir=Path(spec.output_dir).expanduser() / "raw",
            max_documents=spec.max_documents,
            other_files=spec.other_files,
            overwrite=spec.overwrite,
        )
        spec = replace(
            spec,
            source=resolved.source,
            val_source=resolved.val_source,
            documents=resolved.documents,
            text_field=resolved.text_field,
        )
        left_out = resolved.left_out_entries()
        print(resolved.summary())
    elif spec.source is None:
        raise ConfigError("prepare needs a source (text files) or a corpus name (see lightning_cqk.data.corpora).")
    if remote.is_remote(spec.output_dir):
        return _prepare_remote(spec, left_out)
    return _prepare_local(spec, left_out, prefer_existing=prefer_existing)


def _prepare_local(
    spec: PrepareSpec, left_out: list[dict], shown_as: str | None = None, prefer_existing: bool = False
) -> Manifest:
    """``prepare`` into a local directory, once a corpus (if any) is resolved into plain sources.

    ``left_out``: what the corpus left out (the manifest's ``left_out`` starts with it).
    ``shown_as``: the directory's name in messages (the ``s3://`` URL when this is the local build of an upload).
    ``prefer_existing``: finished shards that match the request are reused even with ``overwrite`` (they were built
    by the prepare this one waited for).
    """
    check_documents_mode(spec.documents)
    if spec.val_overlap not in VAL_OVERLAP:
        raise ConfigError(f"val_overlap={spec.val_overlap!r} is not one of {', '.join(map(repr, VAL_OVERLAP))}.")
    if not 0.0 <= spec.val_fraction < 1.0:
        raise ConfigError(f"val_fraction must be in [0, 1), got {spec.val_fraction}.")
    if spec.val_source is None and spec.val_fraction == 0.0:
        raise ConfigError("val_fraction=0 leaves the validation split empty; give val_source or a fraction > 0.")
    num_workers = max(1, int(spec.num_workers))
    out = Path(spec.output_dir).expanduser()
    request = build_request(spec, fingerprint_of(spec.tokenizer, spec.bpe_file))
    train_files, val_files = request.train_files, request.val_files

    if Manifest.exists(out) and (not spec.overwrite or prefer_existing):
        manifest = Manifest.load(out)
        differ = differences(manifest, request)
        if differ and not spec.overwrite:
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
    tok = get_tokenizer(
        spec.tokenizer, spec.bpe_file
    )  # loads the vocabulary now: a missing BPE file fails before any work
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
    with _failures_explained(out, spec.chunk_bytes), _new_build_beside(out) as build:
        with tempfile.TemporaryDirectory(prefix="lightning_cqk_prepare_") as tmp_name:
            tmp = Path(tmp_name)
            train_paths = _materialise(train_files, tmp / "train_src", num_workers)
            val_paths = _materialise(val_files, tmp / "val_src", num_workers)
            gathered = time.perf_counter()
            total = sum(p.stat().st_size for p in train_paths + val_paths)
            target = min(max(total // (num_workers * 4), _MIN_UNIT_BYTES), _MAX_UNIT_BYTES)
            train_units = plan_work_units(train_paths, spec.documents, target)
            val_units = plan_work_units(val_paths, spec.documents, target)
            print(
                f"prepare: {len(train_files) + len(val_files)} source(s), {total / 1e6:.2f} MB -> "
                f"{len(train_units) + len(val_units)} work units on {num_workers} worker(s), "
                f"tokenizer {spec.tokenizer!r}."
            )
            settings = WorkerSettings(
                spec.tokenizer, spec.bpe_file, spec.val_fraction, spec.text_field, spec.documents, dtype.name
            )
            # val first: it is small, so a split that comes out empty fails fast, not after tokenizing train.
            val_sources = request.val_sources
            explicit = val_sources is not None
            if not explicit:
                jobs = {"val": [(u, "val") for u in train_units], "train": [(u, "train") for u in train_units]}
            else:
                jobs = {"val": [(u, "all") for u in val_units], "train": [(u, "all") for u in train_units]}
            drop = explicit and spec.val_overlap == "drop"  # (a hash split cannot overlap: equal texts share a split)
            val_settings = replace(settings, record_digests=drop)
            stats = {
                "val": write_split(
                    "val", jobs["val"], build / "val", tmp, val_settings, num_workers, spec.chunk_bytes, explicit
                )
            }
            exclude = gather_digests(tmp / "reports" / "val", tmp / "val_digests.npy") if drop else None
            train_settings = replace(settings, exclude_digests=exclude)
            stats["train"] = write_split(
                "train", jobs["train"], build / "train", tmp, train_settings, num_workers, spec.chunk_bytes, explicit
            )
        build_id = uuid.uuid4().hex
        for split in ("train", "val"):
            (build / split / BUILD_FILE).write_text(build_id + "\n")
        seconds = time.perf_counter() - start
        tokenize_seconds = time.perf_counter() - gathered
        import litdata

        manifest = Manifest(
            tokenizer=spec.tokenizer,
            tokenizer_fingerprint=tok.fingerprint,
            vocab_size=tok.vocab_size,
            eos_id=tok.eos_id,
            dtype=dtype.name,
            splits={"train": stats["train"], "val": stats["val"]},
            sources=request.sources,
            val_sources=request.val_sources,
            files=file_entries(train_files + val_files),
            val_fraction=spec.val_fraction,
            split_rule=request.split_rule,
            documents_mode=spec.documents,
            text_field=spec.text_field,
            litdata_version=litdata.__version__,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            seconds=round(seconds, 3),
            corpus=spec.corpus,
            left_out=left_out + _val_copies_entry(stats["train"], spec.val_overlap),
            val_overlap=spec.val_overlap if request.val_sources is not None else "n/a",
            extra={"build_id": build_id},
        )
        manifest.save(build)  # written beside the shards while the old build stands: the swap only renames
        _swap_in(build, out)
    print_report(out, manifest, seconds, tokenize_seconds, num_workers)
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


def _prepare_remote(spec: PrepareSpec, left_out: list[dict]) -> Manifest:
    """Prepare into a local folder and upload it to ``spec.output_dir`` (``s3://``), the manifest last.

    A finished remote prepare is reused (or refused, if made with other settings) exactly like a local one: its
    manifest is fetched into the local folder first, so the same reuse check runs.
    """
    output_dir = spec.output_dir
    with tempfile.TemporaryDirectory(prefix="lightning_cqk_upload_") as tmp:
        local = Path(tmp)
        if Manifest.exists(output_dir) and not spec.overwrite:
            (local / MANIFEST_NAME).write_text(remote.read_text(remote.join(output_dir, MANIFEST_NAME)))
        manifest = _prepare_local(replace(spec, output_dir=str(local)), left_out, shown_as=output_dir)
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
            with multiprocessing.get_context(start_method()).Pool(num_workers) as pool:
                texts = pool.map(_gather_builtin, parts)
        for i, part_texts in enumerate(texts):
            path = tmp / f"{f.builtin}-{i:05d}.jsonl"
            path.write_text("".join(json.dumps({"text": text}) + "\n" for text in part_texts), encoding="utf-8")
            paths.append(path)
    return paths


def _gather_builtin(part: tuple[str, int, int]) -> list[str]:
    name, index, count = part
    return [doc.text for doc in BUILTIN_CORPORA[name](part=index, num_parts=count)]


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
