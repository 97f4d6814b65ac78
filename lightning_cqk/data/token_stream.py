"""What both token DataModules share (``TokenDataModule`` and ``MixtureDataModule``): the tokenizer and its numbers,
how windows are cut and batched (``LoaderSpec``), and the datasets and shard fingerprints that ``setup`` fills in.

The two keep their own flat ``__init__`` arguments, because those are the ``data.*`` keys of the command line and
the YAML configs (LightningCLI reads the signature of the class a config names); each turns them into a
``LoaderSpec`` for this base and a ``prepare_spec.PrepareSpec`` for what it prepares.
"""

from __future__ import annotations

from dataclasses import dataclass

import lightning as L

from lightning_cqk.data.tokenizers import eos_id_of, vocab_size_of


@dataclass(frozen=True)
class LoaderSpec:
    """How token windows are cut and batched; each field as the DataModule argument of that name.

    Attributes:
        seq_len: tokens per training sequence (a window is ``seq_len + 1`` tokens).
        batch_size: sequences per training batch (per device).
        val_batch_size: sequences per validation batch (None: ``batch_size``).
        num_workers: DataLoader worker processes.
        shuffle: shuffle the training windows.
        seed: shuffle seed of the training stream (and a mixture's component draws).
        val_seq_len: tokens per validation sequence (None: ``seq_len``).
        cache_dir: where litdata caches chunks streamed from an ``s3://`` data_dir (None: litdata's).
    """

    seq_len: int
    batch_size: int
    val_batch_size: int | None = None
    num_workers: int = 0
    shuffle: bool = True
    seed: int = 42
    val_seq_len: int | None = None
    cache_dir: str | None = None


class TokenStreamDataModule(L.LightningDataModule):
    """The base of the token DataModules: the tokenizer, the window and batch sizes, and what ``setup`` builds.

    Args:
        tokenizer: the tokenizer's name; validated here, without loading anything.
        bpe_file: its local vocabulary file, if any.
        loading: how windows are cut and batched.
    """

    def __init__(self, tokenizer: str, bpe_file: str | None, loading: LoaderSpec) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.bpe_file = bpe_file
        self.seq_len = loading.seq_len
        self.batch_size = loading.batch_size
        self.val_batch_size = loading.val_batch_size or loading.batch_size
        self.num_workers = loading.num_workers
        self.seed = loading.seed
        self._vocab_size = vocab_size_of(tokenizer)  # an unknown name fails now, listing the known ones
        self.train_dataset = None
        self.val_dataset = None
        self.fingerprints: dict[str, dict[str, str]] = {}  # data_dir -> shard_fingerprint at setup (data_guard.py)

    @property
    def vocab_size(self) -> int:
        """Vocabulary size of the configured tokenizer (no I/O)."""
        return self._vocab_size

    @property
    def eos_id(self) -> int:
        """End-of-document id of the configured tokenizer (no I/O)."""
        return eos_id_of(self.tokenizer)
