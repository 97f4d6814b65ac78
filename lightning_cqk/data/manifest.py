"""The manifest of a prepared token-shard directory: what was tokenized, how, and how much.

`manifest.json` is written last (atomically), so a directory without one is an unfinished prepare and is rebuilt.
It records the tokenizer's name and vocabulary fingerprint (checked before training), per-split document, token
and byte counts (bytes give bits-per-byte), the sources and the split rule.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1


@dataclass
class SplitStats:
    """Counts for one split. `tokens` include the EOS after every document; `bytes` are UTF-8 bytes of text."""

    documents: int = 0
    tokens: int = 0
    bytes: int = 0
    replaced_bytes: int = 0

    def add(self, other: SplitStats) -> None:
        self.documents += other.documents
        self.tokens += other.tokens
        self.bytes += other.bytes
        self.replaced_bytes += other.replaced_bytes


@dataclass
class Manifest:
    """Description of a token-shard directory (`<dir>/train`, `<dir>/val`, `<dir>/manifest.json`)."""

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
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def bytes_per_token(self, split: str = "val") -> float:
        """UTF-8 bytes of text per token in a split (for bits per byte)."""
        s = self.splits[split]
        return s.bytes / max(s.tokens, 1)

    def save(self, directory: str | Path) -> Path:
        """Write `manifest.json` atomically (temp file + rename)."""
        path = Path(directory) / MANIFEST_NAME
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=True))
        os.replace(tmp, path)
        return path

    @classmethod
    def exists(cls, directory: str | Path) -> bool:
        return (Path(directory) / MANIFEST_NAME).is_file()

    @classmethod
    def load(cls, directory: str | Path) -> Manifest:
        """Read a manifest, with an error that says how to rebuild when it is missing or corrupt."""
        path = Path(directory) / MANIFEST_NAME
        rebuild = (
            f"Run `lightning_cqk prepare --source <text> --output_dir {directory}` (or let the DataModule prepare it "
            f"from `data.source`), or delete {directory} to start over."
        )
        if not path.is_file():
            raise FileNotFoundError(f"No token shards at {directory}: {path} is missing. {rebuild}")
        try:
            raw = json.loads(path.read_text())
            raw["splits"] = {k: SplitStats(**v) for k, v in raw["splits"].items()}
            manifest = cls(**raw)
        except (json.JSONDecodeError, TypeError, KeyError, AttributeError) as err:
            raise ValueError(f"Corrupt shard manifest {path} ({type(err).__name__}: {err}). {rebuild}") from None
        if manifest.format_version != FORMAT_VERSION:
            raise ValueError(
                f"{path} has format version {manifest.format_version}; this version of lightning_cqk reads "
                f"{FORMAT_VERSION}. {rebuild}"
            )
        return manifest
