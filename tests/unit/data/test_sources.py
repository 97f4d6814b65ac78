"""Sources: what a document is in each mode, JSON lines edge cases, invalid UTF-8, paths, and work units."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import pytest

from lightning_cqk.data import BUILTIN_CORPORA, iter_documents, list_source_files
from lightning_cqk.data.builtin import iter_python_docs, module_docstrings, stdlib_modules, stdlib_root
from lightning_cqk.data.sources import WorkUnit, iter_unit_documents, plan_work_units

BOOK = "Title line\r\n\r\nFirst paragraph,\r\nstill first.\r\n   \r\n\r\nSecond one.\r\nThird line\r\n"


def texts(source, **kwargs) -> list[str]:
    return [d.text for d in iter_documents(str(source), **kwargs)]


def test_document_modes(tmp_path: Path):
    book = tmp_path / "book.txt"
    book.write_bytes(BOOK.encode())
    assert texts(book) == [BOOK], "file mode keeps the file as it is"
    assert texts(book, documents="paragraph") == [
        "Title line",
        "First paragraph,\nstill first.",
        "Second one.\nThird line",
    ]
    assert texts(book, documents="line") == [
        "Title line",
        "First paragraph,",
        "still first.",
        "Second one.",
        "Third line",
    ]
    (tmp_path / "blank.txt").write_text(" \n\t\n")
    assert texts(tmp_path / "blank.txt") == []
    with pytest.raises(ValueError, match="file, paragraph, line"):
        texts(book, documents="sentence")


def test_json_lines(tmp_path: Path):
    records = [
        {"text": "one\u2028still one\x0cand one"},
        "a bare string",
        {"text": None},
        {"text": "  "},
        {"text": "z"},
    ]
    src = tmp_path / "a.jsonl"
    src.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n\n", encoding="utf-8")
    # U+2028 and form feed are raw inside the JSON string: only "\n" may end a record.
    assert texts(src) == ["one\u2028still one\x0cand one", "a bare string", "z"]
    (tmp_path / "body.jsonl").write_text('{"body": "x"}\n')
    assert texts(tmp_path / "body.jsonl", text_field="body") == ["x"]
    with pytest.raises(ValueError, match=r"body\.jsonl:1 has no 'text' field \(found \['body'\]\)"):
        texts(tmp_path / "body.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2 is not valid JSON"):
        texts(tmp_path / "bad.jsonl")
    (tmp_path / "array.json").write_text(json.dumps([{"text": "first"}, "second", {"text": ""}]))
    assert texts(tmp_path / "array.json") == ["first", "second"]


def test_invalid_utf8_is_replaced_and_counted_per_document(tmp_path: Path):
    src = tmp_path / "mixed.txt"
    src.write_bytes(b"clean line\n" + b"caf\xe9 \xff\xfe end\n" + b"cut \xe2\x82\n")
    docs = list(iter_documents(str(src), documents="line"))
    assert [d.text for d in docs] == ["clean line", "caf\ufffd \ufffd\ufffd end", "cut \ufffd"]
    assert [d.replaced for d in docs] == [0, 3, 2], "undecodable bytes, counted where they occur"
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_bytes(b'{"text": "ok"}\n{"text": "bad \xff"}\n')
    assert [(d.text, d.replaced) for d in iter_documents(str(jsonl))] == [("ok", 0), ("bad \ufffd", 1)]


def test_paths_directories_globs_and_errors(corpus: Path, tmp_path: Path):
    files = list_source_files(str(corpus))
    rel = [p.relative_to(corpus).as_posix() for p in files]
    assert rel == sorted(rel, key=lambda r: r.split("/")) and "notes.csv" not in rel and "a.jsonl" in rel
    assert list_source_files(str(corpus / "nested" / "**" / "*.txt")) == [p for p in files if p.suffix == ".txt"]
    assert list_source_files([str(corpus / "a.jsonl"), str(corpus)]) == files, "each file once"
    with pytest.raises(FileNotFoundError, match=r"missing\.txt' does not exist.*builtin:python_docs"):
        list_source_files(str(tmp_path / "missing.txt"))
    with pytest.raises(FileNotFoundError, match="matches no supported file"):
        list_source_files(str(tmp_path / "*.jsonl"))
    with pytest.raises(ValueError, match="unsupported suffix"):
        list_source_files(str(corpus / "notes.csv"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no text files"):
        list_source_files(str(tmp_path / "empty"))


@pytest.mark.parametrize("suffix,mode", [(".jsonl", "file"), (".txt", "line"), (".txt", "paragraph")])
def test_work_units_cut_at_document_boundaries(tmp_path: Path, suffix: str, mode: str):
    path = tmp_path / f"big{suffix}"
    if suffix == ".jsonl":
        body = "".join(json.dumps({"text": f"doc {i} " + "w" * (i % 50)}) + "\n" for i in range(400))
    else:
        body = "".join(f"para {i}\r\n{'x' * (i % 40)}\r\n" + ("\r\n" if i % 3 else "") for i in range(400))
    path.write_text(body, encoding="utf-8")
    whole = [d.text for d in iter_unit_documents(WorkUnit(str(path)), documents=mode)]
    units = plan_work_units([path], mode, target_bytes=1000)
    assert len(units) > 5 and units[0].start == 0 and units[-1].end == path.stat().st_size
    assert all(a.end == b.start for a, b in zip(units, units[1:])), "units tile the file"
    parts = [d.text for u in units for d in iter_unit_documents(u, documents=mode)]
    assert parts == whole and len(whole) > 100
    if suffix == ".txt":
        assert plan_work_units([path], "file", 1000) == [WorkUnit(str(path))], "whole-file documents are never cut"


@pytest.mark.slow  # reads the docstrings of the whole standard library (tens of seconds on CPU; make test runs it)
def test_builtin_corpus_is_english_deterministic_and_sliceable():
    docs = list(iter_python_docs())
    assert len(docs) >= 100
    # A second call (one tenth of it, to keep the test fast) gives the same documents at the same place.
    part = list(iter_python_docs(part=4, num_parts=10))
    start = docs.index(part[0])
    assert len(part) > 10 and docs[start : start + len(part)] == part
    assert BUILTIN_CORPORA["python_docs"] is iter_python_docs
    assert next(iter_documents("builtin:python_docs")) == docs[0]
    text = " ".join(d.text for d in docs).lower()
    assert sum(len(d.text.encode()) for d in docs) > 1_000_000
    for word, least in ((" the ", 5000), (" and ", 1000), (" of ", 2000), (" returns ", 200)):
        assert text.count(word) > least, word
    sources = [d.source for d in docs]
    assert sources[0].startswith("pydoc_data.topics:") and any(s == "stdlib:json/decoder.py" for s in sources)
    folders = {part for s in sources if s.startswith("stdlib:") for part in s[7:].split("/")[:-1]}
    assert "unittest" in folders and not folders & {"test", "tests", "idlelib", "lib2to3", "site-packages", "encodings"}
    assert all(p.is_relative_to(stdlib_root()) for p in islice(stdlib_modules(), 50))
    with pytest.raises(ValueError, match="builtin:python_docs"):
        list(iter_documents("builtin:nope"))


def test_module_docstrings_in_source_order(tmp_path: Path):
    module = tmp_path / "m.py"
    module.write_text(
        '"""Module."""\n'
        "class A:\n"
        '    """Class A."""\n'
        "    def f(self):\n"
        '        """Method f."""\n'
        "def g():\n"
        '    """Function g."""\n'
        "    def inner():\n"
        '        """Inner."""\n'
        "def undocumented():\n"
        "    return 1\n"
    )
    assert module_docstrings(module) == "Module.\n\nClass A.\n\nMethod f.\n\nFunction g.\n\nInner."
    (tmp_path / "py2.py").write_text("print 'python 2'\n")
    assert module_docstrings(tmp_path / "py2.py") == "", "files this Python cannot parse are skipped"
