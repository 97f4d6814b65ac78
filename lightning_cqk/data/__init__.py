"""Data: tokenizers, raw text sources, the built-in corpus, named corpora and their mixtures, ``prepare`` (text ->
litdata token shards) and the streaming DataModules. Data flows one way: sources -> tokenizer -> prepare -> shards +
manifest -> TokenDataModule (or MixtureDataModule).

The DataModules (Lightning) are imported on first use, so that the rest of this package (``builtin``, ``sources``,
``tokenizers``, ``prepare``, ``token_ids``) imports without Lightning.
"""

from __future__ import annotations

import importlib
from typing import Any

from lightning_cqk.data.builtin import BUILTIN_CORPORA
from lightning_cqk.data.corpora import CORPORA
from lightning_cqk.data.manifest import Manifest
from lightning_cqk.data.prepare import prepare
from lightning_cqk.data.sources import iter_documents, list_source_files
from lightning_cqk.data.tokenizers import TOKENIZERS, get_tokenizer, vocab_size_of

_LIGHTNING = {"TokenDataModule": "datamodule", "MixtureComponent": "mixture", "MixtureDataModule": "mixture"}

__all__ = [
    "BUILTIN_CORPORA",
    "CORPORA",
    "TOKENIZERS",
    "Manifest",
    "MixtureComponent",
    "MixtureDataModule",
    "TokenDataModule",
    "get_tokenizer",
    "iter_documents",
    "list_source_files",
    "prepare",
    "vocab_size_of",
]


def __getattr__(name: str) -> Any:
    if name in _LIGHTNING:
        value = getattr(importlib.import_module(f"lightning_cqk.data.{_LIGHTNING[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LIGHTNING))
