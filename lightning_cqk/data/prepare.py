"""Text -> litdata token shards: `lightning_cqk prepare` and the DataModule's `prepare_data`.

Layout of an output directory::

    <output_dir>/train/   litdata chunks + index.json (TokensLoader format: one flat token array per chunk)
    <output_dir>/val/
    <output_dir>/manifest.json   written last; its presence means "finished"

Every document's tokens are followed by EOS. The train/val split is by document and deterministic: a document is in
val when the first 64 bits of blake2b(text) / 2^64 < val_fraction, so it depends only on the text (identical
documents land in the same split, order and worker count do not matter). With `val_source`, `source` is all train
and `val_source` all val. Work is split into file-sized items that `num_workers` processes tokenize in parallel.
A finished directory is reused when asked for again with the same tokenizer and sources; an unfinished one (no
manifest) is rebuilt from scratch, so a directory is never half-valid.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import numpy as np

from lightning_cqk.data.builtin import BUILTIN_CORPORA, builtin_name
from lightning_cqk.data.manifest import Manifest, SplitStats
from lightning_cqk.data.sources import DOCUMENT_MODES, iter_file_documents, list_source_files
from lightning_cqk.data.tokenizers import get_tokenizer

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")

SPLIT_RULE = "blake2b-64(text) / 2^64 < val_fraction -> val"
_BUILTIN_DOCS_PER_FILE = 64


def in_val(text: str, val_fraction: float) -> bool:
    """The deterministic document-level split rule."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < val_fraction


def prepare(
    source: str | list[str],
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
) -> Manifest:
    """Tokenize text into litdata token shards with a train/val split and a manifest.

    Args:
        source: text file, directory, glob (or a list of them) of .txt/.md/.raw or .jsonl files, or a built-in
            corpus such as `builtin:python_docs`.
        output_dir: directory that receives `train/`, `val/` and `manifest.json`.
        tokenizer: `bytes` or `gpt2`.
        bpe_file: local GPT-2 `.tiktoken` file for offline use (or set LIGHTNING_CQK_GPT2_BPE).
        val_fraction: fraction of documents (by content hash) that go to the validation split.
        val_source: optional separate validation text; then all of `source` is train.
        text_field: field of the text in JSON lines.
        documents: what one document is in plain-text files: `file`, `paragraph` (blank-line separated) or `line`.
        num_workers: tokenizer processes.
        chunk_bytes: litdata chunk size.
        overwrite: rebuild even if a finished manifest exists (also allows another tokenizer or source).

    Returns:
        The manifest of the (new or reused) shards.
    """
    if documents not in DOCUMENT_MODES:
        raise ValueError(f"Unknown documents mode {documents!r}; choose one of {', '.join(DOCUMENT_MODES)}.")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}.")
    out = Path(output_dir).expanduser()
    tok = get_tokenizer(tokenizer, bpe_file)
    fingerprint = tok.fingerprint  # loads the vocabulary now, so a missing BPE file fails before any work
    sources, val_sources = _as_list(source), (_as_list(val_source) if val_source is not None else None)

    if Manifest.exists(out) and not overwrite:
        manifest = Manifest.load(out)
        _check_reusable(manifest, out, tokenizer, fingerprint, sources, val_sources, val_fraction)
        print(f"Reusing prepared shards at {out} ({manifest.splits['train'].tokens:,} train tokens).")
        return manifest

    start = time.perf_counter()
    for stale in (out / "train", out / "val", out / "manifest.json"):
        if stale.is_dir():
            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    out.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if tok.vocab_size <= 2**16 else np.int32

    with tempfile.TemporaryDirectory(prefix="lightning_cqk_prepare_") as tmp:
        train_files = _materialise(sources, Path(tmp) / "src")
        val_files = _materialise(val_sources, Path(tmp) / "val_src") if val_sources is not None else None
        plan = {
            "train": [(f, "all" if val_files is not None else "train") for f in train_files],
            "val": [(f, "all") for f in val_files] if val_files is not None else [(f, "val") for f in train_files],
        }
        stats: dict[str, SplitStats] = {}
        for split, work in plan.items():
            stats_dir = Path(tmp) / "stats" / split
            stats_dir.mkdir(parents=True)
            if val_fraction == 0.0 and val_files is None and split == "val":
                raise ValueError("val_fraction=0 leaves the validation split empty; give val_source or a fraction > 0.")
            stats[split] = _write_split(
                work, out / split, stats_dir, tokenizer, bpe_file, val_fraction, text_field, documents, dtype,
                num_workers, chunk_bytes,
            )
        files = [{"path": str(p), "bytes": p.stat().st_size} for p in train_files + (val_files or [])]
        if any(builtin_name(s) for s in sources + (val_sources or [])):
            files = [f for f in files if not f["path"].startswith(tmp)]

    seconds = time.perf_counter() - start
    import litdata

    manifest = Manifest(
        tokenizer=tokenizer,
        tokenizer_fingerprint=fingerprint,
        vocab_size=tok.vocab_size,
        eos_id=tok.eos_id,
        dtype=np.dtype(dtype).name,
        splits=stats,
        sources=sources,
        val_sources=val_sources,
        files=files,
        val_fraction=val_fraction,
        split_rule=SPLIT_RULE if val_sources is None else "source -> train, val_source -> val",
        documents_mode=documents,
        text_field=text_field,
        litdata_version=litdata.__version__,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        seconds=round(seconds, 3),
    )
    manifest.save(out)
    text_mb = sum(s.bytes for s in stats.values()) / 1e6
    n_tokens = sum(s.tokens for s in stats.values())
    print(
        f"Prepared {out}: train {stats['train'].documents:,} docs / {stats['train'].tokens:,} tokens, "
        f"val {stats['val'].documents:,} docs / {stats['val'].tokens:,} tokens; {text_mb:.2f} MB of text in "
        f"{seconds:.1f} s = {text_mb / seconds:.2f} MB/s, {n_tokens / seconds:,.0f} tokens/s "
        f"({num_workers} worker{'s' if num_workers > 1 else ''})."
    )
    if any(s.replaced_bytes for s in stats.values()):
        print(f"Note: {sum(s.replaced_bytes for s in stats.values()):,} non-UTF-8 bytes were replaced with U+FFFD.")
    return manifest


def _as_list(source: str | list[str]) -> list[str]:
    return [str(source)] if isinstance(source, (str, os.PathLike)) else [str(s) for s in source]


def _check_reusable(manifest, out, tokenizer, fingerprint, sources, val_sources, val_fraction) -> None:
    if manifest.tokenizer != tokenizer or manifest.tokenizer_fingerprint != fingerprint:
        raise ValueError(
            f"{out} holds shards made with tokenizer {manifest.tokenizer!r} (fingerprint "
            f"{manifest.tokenizer_fingerprint[:12]}), not {tokenizer!r} ({fingerprint[:12]}). Prepare into another "
            "output_dir, or pass overwrite=True (--overwrite true) to rebuild it."
        )
    if manifest.sources != sources or manifest.val_sources != val_sources or manifest.val_fraction != val_fraction:
        raise ValueError(
            f"{out} was prepared from sources={manifest.sources}, val_sources={manifest.val_sources}, "
            f"val_fraction={manifest.val_fraction}, not sources={sources}, val_sources={val_sources}, "
            f"val_fraction={val_fraction}. Prepare into another output_dir, or pass overwrite=True to rebuild it."
        )


def _materialise(sources: list[str], tmp: Path) -> list[Path]:
    """Source files; built-in corpora are first written as JSON lines (several files, for parallel workers)."""
    files: list[Path] = []
    for spec in sources:
        name = builtin_name(spec)
        if name is None:
            files.extend(list_source_files(spec))
            continue
        tmp.mkdir(parents=True, exist_ok=True)
        docs = list(BUILTIN_CORPORA[name]())
        for i in range(0, len(docs), _BUILTIN_DOCS_PER_FILE):
            path = tmp / f"{name}-{i // _BUILTIN_DOCS_PER_FILE:05d}.jsonl"
            with path.open("w", encoding="utf-8") as f:
                for doc in docs[i : i + _BUILTIN_DOCS_PER_FILE]:
                    f.write(json.dumps({"text": doc.text}) + "\n")
            files.append(path)
    return files


def _write_split(
    work, split_dir, stats_dir, tokenizer, bpe_file, val_fraction, text_field, documents, dtype, num_workers,
    chunk_bytes,
) -> SplitStats:
    from litdata import TokensLoader, optimize

    items = [(i, str(path), keep) for i, (path, keep) in enumerate(work)]
    fn = partial(
        _tokenize_item, tokenizer=tokenizer, bpe_file=bpe_file, val_fraction=val_fraction, text_field=text_field,
        documents=documents, dtype=dtype, stats_dir=str(stats_dir),
    )
    optimize(
        fn=fn,
        inputs=items,
        output_dir=str(split_dir),
        chunk_bytes=chunk_bytes,
        item_loader=TokensLoader(),
        num_workers=max(1, min(num_workers, len(items))),
        mode="overwrite",
        reorder_files=False,
        # litdata defaults to "spawn", which re-imports torch in every worker (seconds each) and re-runs a calling
        # script that lacks an `if __name__ == "__main__":` guard. Workers only tokenize, so fork is safe on Linux.
        start_method="fork" if sys.platform.startswith("linux") else None,
    )
    stats = SplitStats()
    for item_stats in sorted(stats_dir.glob("*.json")):
        stats.add(SplitStats(**json.loads(item_stats.read_text())))
    if stats.documents == 0:
        raise ValueError(
            f"The {split_dir.name} split received no documents. With a small corpus, raise val_fraction, split "
            "plain text into more documents (documents='paragraph' or 'line'), or give val_source explicitly."
        )
    written = _tokens_in_index(split_dir)
    if written != stats.tokens:
        raise RuntimeError(f"{split_dir}: litdata wrote {written} tokens but {stats.tokens} were produced.")
    return stats


def _tokens_in_index(split_dir: Path) -> int:
    index = json.loads((split_dir / "index.json").read_text())
    return sum(chunk["dim"] for chunk in index["chunks"])


def _tokenize_item(
    item: tuple[int, str, str], tokenizer: str, bpe_file: str | None, val_fraction: float, text_field: str,
    documents: str, dtype: type, stats_dir: str,
) -> Iterator[np.ndarray]:
    """litdata worker function: tokenize the documents of one file that belong to this split."""
    index, path, keep = item
    tok = get_tokenizer(tokenizer, bpe_file)
    eos = np.array([tok.eos_id], dtype=dtype)
    stats = SplitStats()
    for doc, replaced in iter_file_documents(Path(path), text_field, documents):
        if keep != "all" and in_val(doc.text, val_fraction) != (keep == "val"):
            continue
        ids = tok.encode_array(doc.text).astype(dtype, copy=False)
        stats.documents += 1
        stats.tokens += len(ids) + 1
        stats.bytes += len(doc.text.encode("utf-8"))
        stats.replaced_bytes += replaced
        yield np.concatenate([ids, eos])
    (Path(stats_dir) / f"{index:06d}.json").write_text(json.dumps(stats.__dict__))
