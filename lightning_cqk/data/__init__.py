"""Data: tokenizers, raw text sources, the built-in corpus, ``prepare`` (text -> litdata token shards) and the
streaming DataModule. Data flows one way: sources -> tokenizer -> prepare -> shards + manifest -> TokenDataModule.
"""

from lightning_cqk.data.builtin import BUILTIN_CORPORA
from lightning_cqk.data.datamodule import TokenDataModule
from lightning_cqk.data.manifest import Manifest
from lightning_cqk.data.prepare import prepare
from lightning_cqk.data.sources import iter_documents, list_source_files
from lightning_cqk.data.tokenizers import TOKENIZERS, get_tokenizer, vocab_size_of

__all__ = [
    "BUILTIN_CORPORA",
    "TOKENIZERS",
    "Manifest",
    "TokenDataModule",
    "get_tokenizer",
    "iter_documents",
    "list_source_files",
    "prepare",
    "vocab_size_of",
]
