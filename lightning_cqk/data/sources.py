"""Raw text sources: files, directories or globs of plain text and JSON lines, read into documents.

Plain text (`.txt`, `.md`, `.raw`, `.text`): `documents` chooses what one document is: the whole `file` (default), a
blank-line separated `paragraph`, or a non-empty `line`. JSON lines (`.jsonl`, `.json`): one document per line,
its `text_field` (a line that is a bare JSON string is also accepted). Bytes that are not valid UTF-8 are replaced
with U+FFFD and counted, never fatal.
"""

from __future__ import annotations

import codecs
import glob
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TEXT_SUFFIXES = (".txt", ".md", ".raw", ".text")
JSONL_SUFFIXES = (".jsonl", ".json")
DOCUMENT_MODES = ("file", "paragraph", "line")

_replaced = [0]


def _count_replacements(err: UnicodeDecodeError) -> tuple[str, int]:
    _replaced[0] += err.end - err.start
    return "\ufffd", err.end


codecs.register_error("lightning_cqk_count", _count_replacements)


@dataclass
class Document:
    """One document and where it came from."""

    text: str
    source: str


def decode_counting(data: bytes) -> tuple[str, int]:
    """Decode UTF-8 with replacement; return the text and the number of undecodable bytes replaced."""
    before = _replaced[0]
    text = data.decode("utf-8", errors="lightning_cqk_count")
    return text, _replaced[0] - before


def list_source_files(source: str | list[str]) -> list[Path]:
    """Expand a file, directory (recursive) or glob, or a list of them, into a sorted list of readable files."""
    specs = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    files: list[Path] = []
    for spec in specs:
        spec = str(spec)
        path = Path(spec).expanduser()
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files.extend(p for p in sorted(path.rglob("*")) if p.is_file() and _readable(p))
        else:
            matches = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True))
            matches = [p for p in matches if p.is_file() and _readable(p)]
            if not matches:
                raise FileNotFoundError(
                    f"Text source {spec!r} matches no file. Give a file, a directory or a glob of "
                    f"{'/'.join(TEXT_SUFFIXES + JSONL_SUFFIXES)} files, or a built-in corpus such as "
                    "'builtin:python_docs'."
                )
            files.extend(matches)
    if not files:
        raise ValueError(f"Text source {source!r} contains no {'/'.join(TEXT_SUFFIXES + JSONL_SUFFIXES)} files.")
    return files


def _readable(path: Path) -> bool:
    return path.suffix.lower() in TEXT_SUFFIXES + JSONL_SUFFIXES


def iter_file_documents(
    path: Path, text_field: str = "text", documents: str = "file"
) -> Iterator[tuple[Document, int]]:
    """Documents of one file with the count of replaced (non-UTF-8) bytes attributed to each."""
    if documents not in DOCUMENT_MODES:
        raise ValueError(f"Unknown documents mode {documents!r}; choose one of {', '.join(DOCUMENT_MODES)}.")
    raw = path.read_bytes()
    text, replaced = decode_counting(raw)
    if path.suffix.lower() in JSONL_SUFFIXES:
        yield from _jsonl_documents(text, path, text_field, replaced)
        return
    if documents == "file":
        pieces = [text]
    elif documents == "paragraph":
        pieces = re.split(r"\n\s*\n", text)
    else:
        pieces = text.splitlines()
    first = True
    for piece in pieces:
        if piece.strip():
            yield Document(piece, str(path)), replaced if first else 0
            first = False


def _jsonl_documents(text: str, path: Path, text_field: str, replaced: int) -> Iterator[tuple[Document, int]]:
    first = True
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{lineno} is not valid JSON ({err.msg}); each line must be one object.") from None
        if isinstance(record, str):
            value = record
        elif isinstance(record, dict) and text_field in record:
            value = record[text_field]
        else:
            keys = list(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(
                f"{path}:{lineno} has no {text_field!r} field (found {keys}); set text_field to the field holding "
                "the text."
            )
        if isinstance(value, str) and value.strip():
            yield Document(value, f"{path}:{lineno}"), replaced if first else 0
            first = False


def iter_documents(source: str | list[str], text_field: str = "text", documents: str = "file") -> Iterator[Document]:
    """All documents of a source (file, directory, glob or list of them), in sorted file order."""
    for path in list_source_files(source):
        for doc, _ in iter_file_documents(path, text_field, documents):
            yield doc
