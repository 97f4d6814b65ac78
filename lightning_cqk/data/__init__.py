"""Data: tokenizers, raw text sources, the built-in corpus, named corpora and their mixtures, ``prepare`` (text ->
litdata token shards) and the streaming DataModules. Data flows one way: sources -> tokenizer -> prepare -> shards +
manifest -> TokenDataModule (or MixtureDataModule).
"""

from lightning_cqk.data.builtin import BUILTIN_CORPORA
from lightning_cqk.data.corpora import CORPORA
from lightning_cqk.data.datamodule import TokenDataModule
from lightning_cqk.data.manifest import Manifest
from lightning_cqk.data.mixture import MixtureComponent, MixtureDataModule
from lightning_cqk.data.prepare import prepare
from lightning_cqk.data.sources import iter_documents, list_source_files
from lightning_cqk.data.tokenizers import TOKENIZERS, get_tokenizer, vocab_size_of

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
