"""Data: tokenizers, raw text sources, the built-in corpus, named corpora and their mixtures, ``prepare`` (text ->
litdata token shards) and the streaming DataModules. Data flows one way: sources -> tokenizer -> prepare -> shards +
manifest -> TokenDataModule (or MixtureDataModule).

The names below are imported on first use, so that the Lightning-free modules of this package (``builtin``,
``sources``, ``tokenizers``, ``token_ids``) can be imported without importing Lightning.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BUILTIN_CORPORA": "builtin",
    "CORPORA": "corpora",
    "TOKENIZERS": "tokenizers",
    "Manifest": "manifest",
    "MixtureComponent": "mixture",
    "MixtureDataModule": "mixture",
    "TokenDataModule": "datamodule",
    "get_tokenizer": "tokenizers",
    "iter_documents": "sources",
    "list_source_files": "sources",
    "prepare": "prepare",
    "vocab_size_of": "tokenizers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"lightning_cqk.data.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
