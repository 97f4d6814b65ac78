"""Built-in offline corpora: human-written English that every Python installation carries.

`python_docs` (source string `builtin:python_docs`):
- the interactive help topics of `pydoc_data.topics` (one document per topic), and
- the docstrings of the standard library's pure-Python modules (one document per module: the module docstring and
  its class and function docstrings, in source order), read with `ast` from the source files, never imported.

Nothing is committed or downloaded: the documents are gathered when `prepare` runs. The exact size depends on the
Python version (CPython 3.11: about 570 documents, 2.0 MB of text); the manifest records what was used.
"""

from __future__ import annotations

import ast
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

from lightning_cqk.data.sources import Document

BUILTIN_PREFIX = "builtin:"

# Standard-library folders that are tests, tools, vendored code or GUI demos rather than documented modules.
_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "turtledemo", "__pycache__",
              "ensurepip", "tkinter", "pydoc_data", "config-3"}


def iter_python_docs() -> Iterator[Document]:
    """The `python_docs` corpus, in a deterministic order."""
    from pydoc_data.topics import topics

    for name in sorted(topics):
        text = topics[name].strip()
        if text:
            yield Document(text, f"pydoc_data.topics:{name}")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if any(part in _SKIP_DIRS or part.startswith("config-") for part in rel.parts[:-1]):
            continue
        text = _module_docstrings(path)
        if text:
            yield Document(text, f"stdlib:{rel.as_posix()}")


def _module_docstrings(path: Path) -> str:
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):
        return ""
    docs = []
    for node in [tree, *ast.walk(tree)]:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and doc.strip() and doc.strip() not in docs:
                docs.append(doc.strip())
    return "\n\n".join(docs)


BUILTIN_CORPORA: dict[str, Callable[[], Iterator[Document]]] = {"python_docs": iter_python_docs}


def builtin_name(source: object) -> str | None:
    """The corpus name if `source` is a `builtin:<name>` string, else None (unknown names raise)."""
    if isinstance(source, str) and source.startswith(BUILTIN_PREFIX):
        name = source[len(BUILTIN_PREFIX) :]
        if name not in BUILTIN_CORPORA:
            raise ValueError(
                f"Unknown built-in corpus {name!r}. Choices: "
                f"{', '.join(BUILTIN_PREFIX + n for n in sorted(BUILTIN_CORPORA))}."
            )
        return name
    return None
