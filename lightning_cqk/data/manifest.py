"""The manifest of a prepared token-shard directory: what was tokenized, how, and how much.

``<dir>/manifest.json`` is written last and atomically (temp file + ``os.replace``), so a directory without one is
an unfinished ``prepare`` and is rebuilt, never trusted. It records the tokenizer (name and vocabulary
fingerprint, checked before training), per-split document/token/byte counts (bytes give bits per byte), the
sources with their files and sizes, and the split rule.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from lightning_cqk.data import remote
from lightning_cqk.errors import ConfigError, MissingInputError
from lightning_cqk.files.atomic import write_json_atomically

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
SPLITS = ("train", "val")


@dataclass
class SplitStats:
    """Counts for one split.

    Attributes:
        documents: documents written.
        tokens: tokens written, including the EOS after every document.
        bytes: UTF-8 bytes of the documents' text (EOS has none).
        replaced_bytes: undecodable input bytes that were replaced with U+FFFD.
        replaced_surrogates: lone surrogate escapes in JSON text that were replaced with U+FFFD.
        first_replaced: ``path:line`` of the first document with a replacement, or "".
        dropped_val_copies: (train) documents left out because their text equals a validation document's.
        dropped_val_copy_bytes: their UTF-8 bytes.
        first_val_copy: ``path:line`` of the first of them, or "".
        skipped_blank: JSON records with blank or null text, and blank files, that were skipped (counted in
            ``train`` for a hash split, where they belong to no split).
        first_skipped: ``path:line`` of the first of them, or "".
    """

    documents: int = 0
    tokens: int = 0
    bytes: int = 0
    replaced_bytes: int = 0
    replaced_surrogates: int = 0
    first_replaced: str = ""
    dropped_val_copies: int = 0
    dropped_val_copy_bytes: int = 0
    first_val_copy: str = ""
    skipped_blank: int = 0
    first_skipped: str = ""

    def add(self, other: SplitStats) -> None:
        """Accumulate another set of counts into this one."""
        self.documents += other.documents
        self.tokens += other.tokens
        self.bytes += other.bytes
        self.replaced_bytes += other.replaced_bytes
        self.replaced_surrogates += other.replaced_surrogates
        self.first_replaced = self.first_replaced or other.first_replaced
        self.dropped_val_copies += other.dropped_val_copies
        self.dropped_val_copy_bytes += other.dropped_val_copy_bytes
        self.first_val_copy = self.first_val_copy or other.first_val_copy
        self.skipped_blank += other.skipped_blank
        self.first_skipped = self.first_skipped or other.first_skipped


@dataclass
class Manifest:
    """Description of a token-shard directory (``<dir>/train``, ``<dir>/val``, ``<dir>/manifest.json``).

    Attributes:
        tokenizer: tokenizer name (a key of ``TOKENIZERS``).
        tokenizer_fingerprint: sha256 of the exact vocabulary.
        vocab_size: vocabulary size, EOS included.
        eos_id: the id that ends every document.
        dtype: numpy dtype of the stored tokens (``uint16`` or ``int32``).
        splits: ``SplitStats`` for ``train`` and ``val``.
        sources: the source strings as given (paths, globs, ``builtin:<name>``).
        val_sources: the explicit validation sources, or None when val is split off by hash.
        files: every file read, ``{"path", "bytes", "split"}`` (``split``: ``hash``, ``train`` or ``val``);
            built-in corpora add one entry with their name, Python version and document count.
        val_fraction: fraction of documents sent to val by the hash rule.
        split_rule: the rule in words.
        documents_mode: ``file``, ``paragraph`` or ``line``.
        text_field: JSON field read from JSON lines.
        litdata_version: litdata that wrote the shards.
        created: UTC time, ISO 8601.
        seconds: wall time of the prepare run.
        corpus: the named corpus (``data.corpus``) the sources were read as, or None.
        left_out: what the source held but the shards do not, one entry per file or group:
            ``{"path", "reason", "documents", "bytes"}`` (``documents`` None where they were not counted), so a
            source that leaves out most of its input says so (see ``corpora.py``).
        val_overlap: ``drop`` or ``keep``: training documents equal to a validation document were left out or
            kept (explicit validation text only; ``n/a`` for a hash split; ``keep`` for manifests older than this
            field, which kept them).
        format_version: version of this file's layout.
        extra: free-form additions (ignored by readers that do not know them).
    """

    tokenizer: str
    tokenizer_fingerprint: str
    vocab_size: int
    eos_id: int
    dtype: str
    splits: dict[str, SplitStats]
    sources: list[str]
    val_sources: list[str] | None
    files: list[dict[str, Any]]
    val_fraction: float
    split_rule: str
    documents_mode: str
    text_field: str
    litdata_version: str
    created: str
    seconds: float = 0.0
    corpus: str | None = None
    left_out: list[dict[str, Any]] = field(default_factory=list)
    val_overlap: str = "keep"
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def bytes_per_token(self, split: str = "val") -> float:
        """UTF-8 bytes of text per stored token in a split (EOS tokens included), for bits per byte."""
        stats = self.splits[split]
        return stats.bytes / max(stats.tokens, 1)

    def save(self, directory: str | Path) -> Path:
        """Write ``manifest.json`` atomically: readers see the old file, the new one, or none, never half."""
        return write_json_atomically(Path(directory) / MANIFEST_NAME, asdict(self), sort_keys=True)

    @staticmethod
    def exists(directory: str | Path) -> bool:
        """Whether ``directory`` (a path or an ``s3://`` prefix) holds a manifest (that is, a finished prepare)."""
        if remote.is_remote(directory):
            return remote.exists(remote.join(directory, MANIFEST_NAME))
        return (Path(directory) / MANIFEST_NAME).is_file()

    @classmethod
    def load(cls, directory: str | Path) -> Manifest:
        """Read ``<directory>/manifest.json``.

        Raises:
            FileNotFoundError: there is no manifest (shards missing or unfinished); the message says how to build.
            ValueError: the manifest is corrupt or from an incompatible version; the message says how to rebuild.
        """
        path = remote.join(directory, MANIFEST_NAME) if remote.is_remote(directory) else Path(directory) / MANIFEST_NAME
        rebuild = (
            f"Rebuild with `lightning_cqk prepare --source <text> --output_dir {directory} --overwrite true` (or let "
            f"the DataModule prepare it from data.source after deleting {directory})."
        )
        if not Manifest.exists(directory):
            raise MissingInputError(f"No finished token shards at {directory}: {path} is missing. {rebuild}")
        try:
            raw = json.loads(remote.read_text(path) if remote.is_remote(directory) else path.read_text())
            known = {f.name for f in fields(cls)}
            raw = {k: v for k, v in raw.items() if k in known}  # tolerate keys added by newer versions
            counts = {f.name for f in fields(SplitStats)}
            raw["splits"] = {
                k: SplitStats(**{c: n for c, n in v.items() if c in counts}) for k, v in raw["splits"].items()
            }
            manifest = cls(**raw)
        except (json.JSONDecodeError, UnicodeDecodeError, TypeError, KeyError, AttributeError) as err:
            raise ConfigError(f"Corrupt shard manifest {path} ({type(err).__name__}: {err}). {rebuild}") from None
        if manifest.format_version != FORMAT_VERSION:
            raise ConfigError(
                f"{path} has format version {manifest.format_version}; this lightning_cqk reads version "
                f"{FORMAT_VERSION}. {rebuild}"
            )
        missing = [s for s in SPLITS if s not in manifest.splits]
        if missing:
            raise ConfigError(f"Corrupt shard manifest {path}: no counts for split(s) {missing}. {rebuild}")
        return manifest
