"""Raw text sources: files, directories or globs of plain text and JSON lines, read into documents.

A source is a file, a directory (searched recursively, in sorted order), a glob, a list of those, or a built-in
corpus named ``builtin:<name>`` (see ``builtin.py``).

* Plain text (``.txt``, ``.md``, ``.raw``, ``.text``): ``documents`` says what one document is: the whole ``file``
  (default), a ``paragraph`` (lines up to the next blank line), or a non-blank ``line``. Line terminators (``\\n``
  or ``\\r\\n``) are not part of line and paragraph documents; paragraph lines are joined with ``\\n``.
  Two corpus formats are modes too: ``wikitext`` (WikiText's ``wiki.*.raw``: an article runs from one top-level
  `` = Title = `` heading line to the next; `` = = Section = = `` lines stay inside) and ``pubtator`` (blank-line
  separated blocks; a PubTator block ``pmid|t|title`` / ``pmid|a|abstract`` / tab-separated annotations gives
  ``title\\nabstract``, any other block is kept as a plain paragraph).
* JSON lines (``.jsonl``, ``.json``): one document per line, the string in ``text_field`` (a line that is a bare
  JSON string is accepted too). A ``.json`` file that starts with ``[`` is read as one array of such records.
  Records whose text is null or blank are skipped (and counted by ``prepare``). A lone surrogate escape
  (``"\\ud800"`` without its pair: not a character, and not encodable as UTF-8) is replaced with U+FFFD and counted
  (``Document.surrogates``), like undecodable bytes; the first one's file and line are reported by ``prepare``.

Only ``\\n`` ends a line: JSON writers may leave U+2028 or form feeds unescaped inside strings, and
``str.splitlines`` would cut records there. Bytes that are not UTF-8 are replaced with U+FFFD and counted per
document (``Document.replaced``), never fatal.

Big files are cut into byte ranges (``WorkUnit``) at document boundaries, so several processes can tokenize one
large file; reading the units of a file in order gives exactly the documents of reading the whole file.
"""

from __future__ import annotations

import codecs
import glob
import json
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from lightning_cqk.data.builtin import BUILTIN_CORPORA, builtin_files, builtin_name, is_builtin
from lightning_cqk.data.document import Document
from lightning_cqk.errors import ConfigError, MissingInputError

TEXT_SUFFIXES = (".txt", ".md", ".raw", ".text")
JSONL_SUFFIXES = (".jsonl", ".json")
DOCUMENT_MODES = ("file", "paragraph", "line", "wikitext", "pubtator")
# A WikiText article heading: " = Title = " (one "=" each side; " = = Section = = " is a sub-heading).
_WIKI_HEADING = re.compile(rb"^ = [^=].*[^=] = $|^ = [^=] = $")
_PUBTATOR_TEXT = re.compile(rb"^\d+\|[ta]\|")
_SURROGATE = re.compile("[\ud800-\udfff]")  # left by json.loads only for unpaired escapes


@dataclass(frozen=True)
class WorkUnit:
    """Bytes ``[start, end)`` of one file (``end=None``: to the end), cut at a document boundary."""

    path: str
    start: int = 0
    end: int | None = None


# Counting decoder: a registered error handler is the only O(n) way to count what ``errors="replace"`` replaces.
# The count lives in a thread-local so concurrent readers in one process do not mix their counts.
_counts = threading.local()


def _count_and_replace(err: UnicodeDecodeError) -> tuple[str, int]:
    _counts.replaced = getattr(_counts, "replaced", 0) + (err.end - err.start)
    return "\ufffd", err.end


codecs.register_error("lightning_cqk_count", _count_and_replace)


def decode_counting(data: bytes) -> tuple[str, int]:
    """Decode UTF-8 exactly like ``errors="replace"``; also return the number of undecodable bytes."""
    _counts.replaced = 0
    text = data.decode("utf-8", errors="lightning_cqk_count")
    return text, _counts.replaced


def as_source_list(source: str | os.PathLike | list[str] | tuple[str, ...]) -> list[str]:
    """A source, or a list of sources, as a list of strings."""
    if isinstance(source, (str, os.PathLike)):
        return [str(source)]
    return [str(s) for s in source]


def list_source_files(source: str | list[str]) -> list[Path]:
    """Expand a file, directory (recursive), glob, or a list of them, into a sorted, de-duplicated file list.

    Built-in corpora list the files they are gathered from.

    Raises:
        FileNotFoundError: a path or glob matches nothing (the message says what is accepted).
        ValueError: a named file has an unsupported suffix, or a directory holds no supported file.
    """
    files: list[Path] = []
    for spec in as_source_list(source):
        if is_builtin(spec):
            files.extend(builtin_files(builtin_name(spec)))
            continue
        path = Path(spec).expanduser()
        if path.is_file():
            if not _supported(path):
                raise ConfigError(f"{path} has an unsupported suffix; {_accepted()}")
            files.append(path)
        elif path.is_dir():
            found = _walk(path)
            if not found:
                raise ConfigError(f"Directory {path} holds no text files; {_accepted()}")
            files.extend(found)
        else:
            matches = sorted(glob.glob(os.path.expanduser(spec), recursive=True))
            found = [f for m in matches for f in (_walk(Path(m)) if Path(m).is_dir() else [Path(m)]) if _supported(f)]
            if not found:
                what = "matches no supported file" if any(c in spec for c in "*?[") else "does not exist"
                raise MissingInputError(f"Text source {spec!r} {what}. {_accepted()}")
            files.extend(found)
    unique = list(dict.fromkeys(files))  # a file named twice (a folder and a glob inside it) is read once
    if not unique:
        raise ConfigError(f"Text source {source!r} is empty. {_accepted()}")
    return unique


def unsupported_entries(source: str | list[str]) -> list[dict]:
    """Files under a source's folders and globs that ``list_source_files`` does not read (unsupported suffixes).

    Hidden files and folders are not listed (never data by convention). One entry per file, in the manifest's
    ``left_out`` form: ``{"path", "reason", "documents": None, "bytes"}``.
    """
    found: list[Path] = []
    for spec in as_source_list(source):
        if is_builtin(spec):
            continue
        path = Path(spec).expanduser()
        if path.is_dir():
            roots = [path]
        elif path.is_file():
            roots = []
        else:
            roots = [Path(m) for m in sorted(glob.glob(os.path.expanduser(spec), recursive=True))]
        for root in roots:
            for f in _walk(root, supported=False) if root.is_dir() else [root]:
                if f.is_file() and not _supported(f) and not f.name.startswith("."):
                    found.append(f)
    return [
        {
            "path": str(f.resolve()),
            "reason": f"unsupported file type ({''.join(f.suffixes[-2:]) or 'no suffix'}): not read",
            "documents": None,
            "bytes": f.stat().st_size,
        }
        for f in dict.fromkeys(found)
    ]


def iter_documents(
    path_or_glob: str | list[str], text_field: str = "text", documents: str = "file"
) -> Iterator[Document]:
    """All documents of a source, in order: sorted files, then document order inside each file.

    Args:
        path_or_glob: a file, directory, glob, ``builtin:<name>``, or a list of those.
        text_field: the JSON field that holds the text in ``.jsonl``/``.json`` files.
        documents: ``file``, ``paragraph`` or ``line``: what one document is in plain-text files.
    """
    check_documents_mode(documents)
    for spec in as_source_list(path_or_glob):
        if is_builtin(spec):
            yield from BUILTIN_CORPORA[builtin_name(spec)]()
            continue
        for path in list_source_files(spec):
            yield from iter_unit_documents(WorkUnit(str(path)), text_field, documents)


def check_documents_mode(documents: str) -> None:
    """Raise a ValueError listing the choices when ``documents`` is not a known mode."""
    if documents not in DOCUMENT_MODES:
        raise ConfigError(f"Unknown documents mode {documents!r}; choose one of {', '.join(DOCUMENT_MODES)}.")


def plan_work_units(files: list[Path], documents: str, target_bytes: int) -> list[WorkUnit]:
    """Cut files into units of about ``target_bytes`` at document boundaries (whole-file documents stay whole)."""
    units: list[WorkUnit] = []
    for path in files:
        size = path.stat().st_size
        mode = _boundary_mode(path, documents)
        if mode is None or size <= target_bytes:
            units.append(WorkUnit(str(path)))
            continue
        cuts = [0]
        with path.open("rb") as f:
            for k in range(1, -(-size // target_bytes)):
                cut = _next_boundary(f, max(k * target_bytes, cuts[-1]), mode)
                if cut >= size:
                    break
                if cut > cuts[-1]:
                    cuts.append(cut)
        cuts.append(size)
        units.extend(WorkUnit(str(path), a, b) for a, b in zip(cuts[:-1], cuts[1:]))
    return units


def iter_unit_documents(
    unit: WorkUnit, text_field: str = "text", documents: str = "file", on_skip: Callable[[str], None] | None = None
) -> Iterator[Document]:
    """The documents of one work unit (a whole file or a byte range of it).

    ``on_skip(where)`` is called for each record skipped for blank or null text (JSON) and each blank file
    (``documents="file"``), so what is left out can be counted.
    """
    skip = on_skip or (lambda where: None)
    path = Path(unit.path)
    with path.open("rb") as f:
        f.seek(unit.start)
        data = f.read() if unit.end is None else f.read(unit.end - unit.start)
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        if suffix == ".json" and unit.start == 0 and data.lstrip()[:1] == b"[":
            yield from _json_array_documents(data, unit, text_field, skip)
        else:
            yield from _jsonl_documents(data, unit, text_field, skip)
    elif documents == "file":
        text, replaced = decode_counting(data)
        if text.strip():
            yield Document(text, unit.path, replaced)
        else:
            skip(unit.path)
    else:
        yield from _text_documents(data, unit, documents)


def _text_documents(data: bytes, unit: WorkUnit, documents: str) -> Iterator[Document]:
    if documents == "wikitext":
        yield from _wikitext_documents(data, unit)
        return
    if documents == "pubtator":
        for doc in _text_documents(data, unit, "paragraph"):
            yield _pubtator_document(doc)
        return
    paragraph: list[bytes] = []
    first_line = 0
    lines = data.split(b"\n")
    for lineno, line in enumerate(lines, start=1):
        line = line.removesuffix(b"\r")
        blank = not line.strip()
        if documents == "line":
            if not blank:
                yield _document(line, unit, lineno)
        elif blank:
            if paragraph:
                yield _document(b"\n".join(paragraph), unit, first_line)
                paragraph = []
        else:
            first_line = first_line if paragraph else lineno
            paragraph.append(line)
    if paragraph:
        yield _document(b"\n".join(paragraph), unit, first_line)


def _wikitext_documents(data: bytes, unit: WorkUnit) -> Iterator[Document]:
    """Articles of a ``wiki.*.raw`` file: each starts at a top-level heading line (kept as its first line)."""
    article: list[bytes] = []
    first_line = 1
    for lineno, line in enumerate(data.split(b"\n"), start=1):
        line = line.removesuffix(b"\r")
        if _WIKI_HEADING.match(line) and article:
            yield from _wikitext_article(article, unit, first_line)
            article, first_line = [], lineno
        article.append(line)
    yield from _wikitext_article(article, unit, first_line)


def _wikitext_article(lines: list[bytes], unit: WorkUnit, lineno: int) -> Iterator[Document]:
    raw = b"\n".join(line for line in lines if line.strip())
    if raw.strip():
        yield _document(raw, unit, lineno)


def _pubtator_document(doc: Document) -> Document:
    """``title\\nabstract`` of a PubTator block (annotation lines dropped); any other block unchanged."""
    lines = doc.text.split("\n")
    if not _PUBTATOR_TEXT.match(lines[0].encode("utf-8")):
        return doc
    parts = [line.split("|", 2)[2] for line in lines if _PUBTATOR_TEXT.match(line.encode("utf-8"))]
    return Document("\n".join(p for p in parts if p.strip()), doc.source, doc.replaced)


def _jsonl_documents(data: bytes, unit: WorkUnit, text_field: str, skip: Callable[[str], None]) -> Iterator[Document]:
    for lineno, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        text, replaced = decode_counting(line)
        where = _where(unit, lineno)
        try:
            record = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{where} is not valid JSON ({err.msg}); each line must be one JSON object.") from None
        value = _record_text(record, text_field, where)
        if value is not None:
            value, surrogates = _SURROGATE.subn("\ufffd", value)
            yield Document(value, where, replaced, surrogates)
        else:
            skip(where)


def _json_array_documents(
    data: bytes, unit: WorkUnit, text_field: str, skip: Callable[[str], None]
) -> Iterator[Document]:
    text, replaced = decode_counting(data)
    try:
        records = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{unit.path} is not valid JSON ({err.msg} at line {err.lineno}).") from None
    for i, record in enumerate(records):
        value = _record_text(record, text_field, f"{unit.path}[{i}]")
        if value is not None:
            value, surrogates = _SURROGATE.subn("\ufffd", value)
            yield Document(value, f"{unit.path}[{i}]", replaced, surrogates)
            replaced = 0  # a whole-file count is attributed to the first document
        else:
            skip(f"{unit.path}[{i}]")


def _record_text(record: object, text_field: str, where: str) -> str | None:
    if isinstance(record, str):
        value = record
    elif isinstance(record, dict) and text_field in record:
        value = record[text_field]
    else:
        found = list(record) if isinstance(record, dict) else type(record).__name__
        raise ConfigError(
            f"{where} has no {text_field!r} field (found {found}); set text_field to the field holding the text."
        )
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{where}: field {text_field!r} holds {type(value).__name__}, not text.")
    return value if value.strip() else None


def _document(raw: bytes, unit: WorkUnit, lineno: int) -> Document:
    text, replaced = decode_counting(raw)
    return Document(text, _where(unit, lineno), replaced)


def _where(unit: WorkUnit, lineno: int) -> str:
    """``path:line`` for whole files; line numbers inside a byte range are relative, so say so."""
    if unit.start == 0:
        return f"{unit.path}:{lineno}"
    return f"{unit.path} (line {lineno} after byte {unit.start})"


def _boundary_mode(path: Path, documents: str) -> str | None:
    """How a file may be cut: at any line start, after a blank line, or not at all."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return "line"
    if suffix == ".json":
        with path.open("rb") as f:
            return None if f.read(4096).lstrip()[:1] == b"[" else "line"
    return {"line": "line", "paragraph": "paragraph", "pubtator": "paragraph", "wikitext": "wikitext"}.get(documents)


def _next_boundary(f: BinaryIO, offset: int, mode: str) -> int:
    """The first document boundary at or after ``offset`` (the file size if there is none)."""
    f.seek(offset)
    f.readline()  # finish the line ``offset`` falls in; the next line start is a boundary for line mode
    if mode == "line":
        return f.tell()
    if mode == "wikitext":  # cut just before an article heading
        while True:
            start = f.tell()
            line = f.readline()
            if not line or _WIKI_HEADING.match(line.rstrip(b"\r\n")):
                return start
    while line := f.readline():
        if not line.strip():  # a blank line ends a paragraph, so the line after it starts a new one
            return f.tell()
    return f.tell()


def _supported(path: Path) -> bool:
    return path.suffix.lower() in TEXT_SUFFIXES + JSONL_SUFFIXES and not path.name.startswith(".")


def _walk(root: Path, supported: bool = True) -> list[Path]:
    """Supported files (``supported=False``: all files) under ``root`` in sorted relative-path order, skipping
    hidden files and folders."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(
            Path(dirpath) / name
            for name in sorted(filenames)
            if not name.startswith(".") and (_supported(Path(name)) or not supported)
        )
    return sorted(found, key=lambda p: p.relative_to(root).parts)


def _accepted() -> str:
    return (
        f"Accepted: a file, directory or glob of {'/'.join(TEXT_SUFFIXES)} (plain text) or "
        f"{'/'.join(JSONL_SUFFIXES)} (JSON lines) files, a list of those, or a built-in corpus such as "
        "'builtin:python_docs'."
    )
