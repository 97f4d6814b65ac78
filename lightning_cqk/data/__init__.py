"""Data: tokenizers, raw text sources, `prepare` (text -> litdata token shards) and the streaming DataModule."""

from lightning_cqk.data.builtin import BUILTIN_CORPORA
from lightning_cqk.data.datamodule import TokenDataModule
from lightning_cqk.data.manifest import Manifest
from lightning_cqk.data.prepare import prepare
from lightning_cqk.data.sources import iter_documents
from lightning_cqk.data.tokenizers import TOKENIZERS, get_tokenizer, vocab_size_of

__all__ = [
    "BUILTIN_CORPORA",
    "TOKENIZERS",
    "Manifest",
    "TokenDataModule",
    "get_tokenizer",
    "iter_documents",
    "prepare",
    "vocab_size_of",
]
