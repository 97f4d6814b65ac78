"""`Document`: one text document as the readers yield it (`sources.py` for files, `builtin.py` for built-in corpora)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Document:
    """One document, where it came from (``path:line``), and what was replaced with U+FFFD while reading it.

    Attributes:
        text: the document.
        source: ``path:line`` (or ``path[i]`` in a JSON array).
        replaced: undecodable input bytes replaced.
        surrogates: lone surrogate escapes of JSON text replaced.
    """

    text: str
    source: str
    replaced: int = 0
    surrogates: int = 0
