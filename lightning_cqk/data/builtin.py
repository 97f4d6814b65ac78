"""Built-in offline corpora: human-written English that every Python installation carries.

``python_docs`` (source string ``builtin:python_docs``):

* the interactive help topics of ``pydoc_data.topics`` (one document per topic, sorted by topic name), then
* the docstrings of the standard library's pure-Python modules, one document per module (the module docstring and
  its class, method and function docstrings in source order, joined by blank lines), in sorted path order. The
  files under ``sysconfig.get_paths()["stdlib"]`` are parsed with ``ast``; no module is imported.

Skipped: tests, IDLE, turtle demos, vendored or installed packages (``site-packages``), ``lib2to3`` and
``ensurepip``, and ``encodings`` (a hundred generated codec modules with near-identical docstrings).

Nothing is committed or downloaded: documents are gathered when ``prepare`` runs, and their number depends on the
Python version. Measured on CPython 3.11.7: 486 documents, 2.09 MB of UTF-8 text (79 topics, 0.47 MB; 407 modules,
1.62 MB); 2.09 M byte tokens or 0.59 M GPT-2 tokens. Gathering parses ~450 files (time: docs/speed.md).
Every ``BUILTIN_CORPORA`` value is a function returning an iterator of documents.
"""

from __future__ import annotations

import ast
import os
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

from lightning_cqk.data.document import Document
from lightning_cqk.errors import ConfigError

BUILTIN_PREFIX = "builtin:"

# Folders that hold tests, tools, demos, vendored code or generated boilerplate rather than documented modules.
_SKIP_DIRS = frozenset(
    {
        "test",
        "tests",
        "idlelib",
        "turtledemo",
        "site-packages",
        "dist-packages",
        "lib2to3",
        "ensurepip",
        "encodings",
        "pydoc_data",
        "lib-dynload",
        "__pycache__",
    }
)
_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def stdlib_root() -> Path:
    """The standard library folder of the running interpreter (the base one, also inside a virtualenv)."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_modules() -> list[Path]:
    """Pure-Python standard-library files that ``python_docs`` reads, in sorted relative-path order."""
    root = stdlib_root()
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Prune while walking: site-packages can hold many thousand files we would only throw away.
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith((".", "config-")))
        found.extend(Path(dirpath) / name for name in filenames if name.endswith(".py"))
    return sorted(found, key=lambda p: p.relative_to(root).parts)


def iter_python_docs(part: int = 0, num_parts: int = 1) -> Iterator[Document]:
    """The ``python_docs`` corpus, in a deterministic order (topics, then modules).

    Args:
        part: which contiguous slice of the corpus to yield (for parallel gathering).
        num_parts: number of slices; reading parts ``0 .. num_parts - 1`` in order gives the whole corpus.
    """
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data; the docstrings alone still make a corpus
        topics = {}
    root = stdlib_root()
    items: list[str | Path] = [*sorted(topics), *stdlib_modules()]
    for item in items[part * len(items) // num_parts : (part + 1) * len(items) // num_parts]:
        if isinstance(item, str):
            text, origin = topics[item].strip(), f"pydoc_data.topics:{item}"
        else:
            text, origin = module_docstrings(item), f"stdlib:{item.relative_to(root).as_posix()}"
        if text:
            yield Document(text, origin)


def module_docstrings(path: Path) -> str:
    """A module's docstrings (module, classes, functions, methods) in source order, joined by blank lines.

    Returns an empty string for files that do not parse with this interpreter's grammar.
    """
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):
        return ""
    docs: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, _DOCUMENTED):
            doc = ast.get_docstring(node, clean=True)
            if doc and doc.strip():
                docs.append(doc.strip())
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return "\n\n".join(docs)


def python_docs_files() -> list[Path]:
    """The files ``python_docs`` is gathered from (for manifests): the topics module and the stdlib modules."""
    topics_file = stdlib_root() / "pydoc_data" / "topics.py"
    return ([topics_file] if topics_file.is_file() else []) + stdlib_modules()


BUILTIN_CORPORA: dict[str, Callable[..., Iterator[Document]]] = {"python_docs": iter_python_docs}
"""Built-in corpora by name; select one with the source string ``builtin:<name>``. Each is called as
``fn()`` for the whole corpus or ``fn(part=i, num_parts=n)`` for the i-th of n contiguous slices."""

_BUILTIN_FILES: dict[str, Callable[[], list[Path]]] = {"python_docs": python_docs_files}


def is_builtin(spec: object) -> bool:
    """Whether a source string names a built-in corpus (``builtin:<name>``)."""
    return str(spec).startswith(BUILTIN_PREFIX)


def builtin_name(source: object) -> str | None:
    """The corpus name if ``source`` is a ``builtin:<name>`` string, else None.

    Raises:
        ValueError: the name after ``builtin:`` is not a known corpus (the message lists them).
    """
    if isinstance(source, str) and source.startswith(BUILTIN_PREFIX):
        name = source[len(BUILTIN_PREFIX) :]
        if name not in BUILTIN_CORPORA:
            choices = ", ".join(BUILTIN_PREFIX + n for n in sorted(BUILTIN_CORPORA))
            raise ConfigError(f"Unknown built-in corpus {name!r}. Choices: {choices}.")
        return name
    return None


def builtin_files(name: str | None) -> list[Path]:
    """The files a built-in corpus is gathered from."""
    if name not in _BUILTIN_FILES:
        raise ConfigError(f"Unknown built-in corpus {name!r}. Choices: {sorted(BUILTIN_CORPORA)}.")
    return _BUILTIN_FILES[name]()
