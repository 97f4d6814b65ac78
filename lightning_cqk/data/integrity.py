"""Integrity checks of prepared token shards, run by the DataModules before training touches them.

At setup (cheap, no token is read): each split's litdata `index.json` must parse and list its chunks, and every
chunk file must exist with exactly the byte size the index records, so a truncated or missing shard (a copy cut
short, a full disk, a deleted file) is refused with the file's name and the command that rebuilds the directory.
While training: every batch's token ids are checked against the vocabulary on the CPU before the batch is moved
(one `max` over a few thousand integers), so damaged bytes inside a chunk of the right size, which decode to ids
outside the vocabulary, stop the run at the first such batch instead of indexing out of the embedding table.
(Damage that happens to decode to valid ids cannot be told from text; `prepare` output is otherwise trusted.)

Builds and changes (issue 25): every build of `prepare` has an id, written into `manifest.json` (`extra.build_id`) and
into each split folder (`<split>/.build_id`) before the manifest; `check_build` refuses a manifest beside another
build's shards. `shard_fingerprint` identifies what a run reads: `content` (the manifest without its times, and each
split's chunk list: the same for an identical rebuild) and `files` (inode, size and modification time of the manifest,
the indexes and every chunk: any rewrite changes it). A run records both at setup and checks `files` at every
validation and checkpoint save and `content` on resume (`callbacks/data_guard.py`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from lightning_cqk.data import remote
from lightning_cqk.errors import ConfigError, MissingInputError


def rebuild_hint(data_dir: str | Path, tokenizer: str | None = None) -> str:
    """How to rebuild a shard directory."""
    name = tokenizer or "<name>"
    return (
        f"Rebuild it: `lightning_cqk prepare --source <text> --output_dir {data_dir} --tokenizer {name} "
        f"--overwrite true`, or delete {data_dir} and let the DataModule prepare it again from data.source."
    )


def check_split(data_dir: str | Path, split: str, tokenizer: str | None = None) -> dict:
    """Check `<data_dir>/<split>/index.json` and its chunk files; return the parsed index.

    Raises:
        FileNotFoundError: the index or a chunk file is missing.
        ValueError: the index is corrupt, or a chunk's size differs from the index (truncated or overwritten).
    """
    hint = rebuild_hint(data_dir, tokenizer)
    split_dir = remote.join(data_dir, split)
    index_path = remote.join(split_dir, "index.json")
    try:
        text = remote.read_text(index_path) if remote.is_remote(data_dir) else Path(index_path).read_text()
    except FileNotFoundError:
        raise MissingInputError(
            f"The {split} shards at {data_dir} are incomplete: {index_path} is missing. {hint}"
        ) from None
    try:
        index = json.loads(text)
        chunks = index["chunks"]
        entries = [(c["filename"], int(c["chunk_bytes"]), int(c["dim"])) for c in chunks]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ConfigError(
            f"The {split} shard index {index_path} is corrupt ({type(err).__name__}: {err}). {hint}"
        ) from None
    if remote.is_remote(data_dir):
        return index  # sizes of remote chunks are checked by litdata when it downloads them
    for filename, expected, _ in entries:
        path = Path(split_dir) / filename
        if not path.is_file():
            raise MissingInputError(f"Shard {path} is missing (listed in {index_path}). {hint}")
        size = path.stat().st_size
        if size != expected:
            what = "truncated" if size < expected else "longer than written"
            raise ConfigError(
                f"Shard {path} is {what}: {size:,} bytes, but {index_path} records {expected:,}. The copy or the "
                f"prepare that made it was cut short, or the file was changed since. {hint}"
            )
    return index


def check_stream_end(data_dir: str | Path, split: str, index: dict, eos_id: int, dtype: str, tokenizer: str) -> None:
    """Refuse a split whose token stream does not end with ``eos_id`` (one token read from the last chunk).

    Every document ``prepare`` writes ends with the tokenizer's EOS, so the last token of a split is EOS. Shards made
    with another tokenizer (a manifest edited by hand to name this one) end with that tokenizer's EOS instead.
    Remote shards are not read here.
    """
    if remote.is_remote(data_dir) or not index.get("chunks"):
        return
    last = Path(remote.join(data_dir, split)) / index["chunks"][-1]["filename"]
    width = np.dtype(dtype).itemsize
    with last.open("rb") as f:
        f.seek(-width, 2)
        token = int(np.frombuffer(f.read(width), dtype=dtype)[0])
    if token != eos_id:
        raise ConfigError(
            f"The {split} shards at {data_dir} end with token id {token}, not {tokenizer!r}'s end-of-document id "
            f"{eos_id}: they were made with another tokenizer than their manifest.json says (edited by hand?), or "
            f"the last chunk {last} is damaged. {rebuild_hint(data_dir, tokenizer)}"
        )


def check_token_range(batch, vocab_size: int, where: str) -> None:
    """Refuse a (numpy) token batch holding ids outside [0, vocab_size): the shard bytes are damaged."""
    top = int(batch.max()) if batch.size else 0
    if top >= vocab_size or (batch.size and int(batch.min()) < 0):
        raise ConfigError(
            f"A batch read from {where} holds token id {top}, outside the vocabulary (size {vocab_size}): the shard "
            f"bytes are damaged, or the shards were made with a larger vocabulary than data.tokenizer's. "
            f"{rebuild_hint(where)}"
        )


BUILD_FILE = ".build_id"
_VOLATILE = ("created", "seconds", "litdata_version", "extra")  # manifest fields that differ between equal builds


def check_build(data_dir: str | Path, build_id: str | None, tokenizer: str | None = None) -> None:
    """Refuse a manifest that sits beside another build's shards (its build id differs from a split's)."""
    if build_id is None or remote.is_remote(data_dir):
        return  # shards made before build ids, or remote: nothing to compare
    for split in ("train", "val"):
        path = Path(data_dir) / split / BUILD_FILE
        found = path.read_text().strip() if path.is_file() else None
        if found != build_id:
            raise ValueError(
                f"The {split} shards at {data_dir} are not the build its manifest.json describes (manifest build "
                f"{build_id}, {split}/{BUILD_FILE}: {found or 'missing'}): two prepares wrote into the folder at once "
                f"(on a file system that does not carry locks between hosts?), or files were copied in by hand. "
                f"{rebuild_hint(data_dir, tokenizer)}"
            )


def shard_fingerprint(data_dir: str | Path) -> dict[str, str]:
    """``{"content": sha256, "files": sha256}`` of a local shard folder (module docstring); {} for ``s3://``."""
    if remote.is_remote(data_dir):
        return {}
    root = Path(data_dir)
    content, files = hashlib.sha256(), hashlib.sha256()

    def stat(path: Path) -> None:
        try:
            st = path.stat()
            files.update(f"{path.relative_to(root)}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns};".encode())
        except FileNotFoundError:
            files.update(f"{path.relative_to(root)}:missing;".encode())

    manifest = root / "manifest.json"
    stat(manifest)
    try:
        data = json.loads(manifest.read_text())
        content.update(json.dumps({k: v for k, v in data.items() if k not in _VOLATILE}, sort_keys=True).encode())
    except (OSError, ValueError):
        content.update(b"no manifest")
    for split in ("train", "val"):
        index_path = root / split / "index.json"
        stat(index_path)
        try:
            chunks = json.loads(index_path.read_text()).get("chunks", [])
        except (OSError, ValueError):
            chunks = []
            content.update(f"{split}: no index;".encode())
        for chunk in chunks:
            name = str(chunk.get("filename"))
            content.update(f"{split}/{name}:{chunk.get('chunk_bytes')}:{chunk.get('dim')};".encode())
            stat(root / split / name)
    return {"content": content.hexdigest(), "files": files.hexdigest()}
