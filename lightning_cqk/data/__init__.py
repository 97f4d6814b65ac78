"""Data: tokenizers, raw text sources, the built-in corpus, named corpora and their mixtures, ``prepare`` (text ->
litdata token shards) and the streaming DataModules. Data flows one way: sources -> tokenizer -> prepare -> shards +
manifest -> TokenDataModule (or MixtureDataModule).

The DataModules (Lightning) are imported on first use, so that the rest of this package (``builtin``, ``sources``,
``tokenizers``, ``prepare``, ``token_ids``) imports without Lightning.

``prepare`` is five files, one job each: ``prepare_spec.py`` (``PrepareSpec``: the options of one prepare, built by
``prepare`` from its flags and by the DataModules from their ``data.*`` arguments), ``prepare.py`` (the orchestration:
the folder held, a corpus resolved, the build made beside the old one and swapped in), ``prepare_split.py`` (one
split through litdata's ``optimize``), ``prepare_worker.py`` (what runs in litdata's worker processes) and
``prepare_report.py`` (what a finished prepare prints). ``token_stream.py`` is the DataModules' shared base.
"""

from __future__ import annotations

import importlib
from typing import Any

from lightning_cqk.data.builtin import BUILTIN_CORPORA
from lightning_cqk.data.corpora import CORPORA
from lightning_cqk.data.manifest import Manifest
from lightning_cqk.data.prepare import prepare, prepare_shards
from lightning_cqk.data.prepare_spec import PrepareSpec
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
    "PrepareSpec",
    "TokenDataModule",
    "get_tokenizer",
    "iter_documents",
    "list_source_files",
    "prepare",
    "prepare_shards",
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
