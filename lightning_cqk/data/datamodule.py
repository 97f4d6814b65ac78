"""Streaming DataModule over prepared token shards (litdata `StreamingDataset` + `TokensLoader`).

Each sample is a window of `seq_len + 1` consecutive tokens (inputs and next-token targets), cut from the token
stream without overlap; litdata drops the tail of every chunk that does not fill a whole window. Training windows
are shuffled (seeded); validation windows are read in order, so every run of an ablation sees the same validation
set. The DataLoader state (position in the stream) is checkpointed by Lightning, so resumed runs continue where
they stopped.
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
import numpy as np
import torch

from lightning_cqk.data.manifest import Manifest
from lightning_cqk.data.prepare import prepare
from lightning_cqk.data.tokenizers import eos_id_of, get_tokenizer, vocab_size_of

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")


def collate_tokens(items: list) -> torch.Tensor:
    """Stack token windows (numpy arrays or tensors, possibly uint16) into a (B, seq_len + 1) int64 batch."""
    return torch.from_numpy(np.stack([np.asarray(item) for item in items]).astype(np.int64))


class TokenDataModule(L.LightningDataModule):
    """Token windows for next-token prediction, streamed from `data_dir` (prepared from `source` if missing).

    Args:
        data_dir: directory with `train/`, `val/` and `manifest.json` (see `lightning_cqk prepare`).
        source: text to prepare from when `data_dir` has no finished shards (file, directory, glob, list, or
            `builtin:python_docs`); None means the shards must already exist.
        tokenizer: `bytes` or `gpt2`; must match the tokenizer the shards were made with.
        bpe_file: local GPT-2 `.tiktoken` file for offline use (or set LIGHTNING_CQK_GPT2_BPE).
        seq_len: tokens per training sequence (the model's block_size is linked to it).
        batch_size: sequences per training batch (per device).
        val_batch_size: sequences per validation batch (default: batch_size).
        num_workers: DataLoader worker processes.
        val_fraction: fraction of documents for validation when preparing.
        val_source: separate validation text when preparing.
        documents: what a document is in plain-text sources: `file`, `paragraph` or `line`.
        text_field: JSON-lines field holding the text.
        shuffle: shuffle training windows.
        seed: shuffle seed of the training stream.
        prepare_workers: processes used by prepare.
    """

    def __init__(
        self,
        data_dir: str = "data/python_docs-bytes",
        source: str | list[str] | None = "builtin:python_docs",
        tokenizer: str = "bytes",
        bpe_file: str | None = None,
        seq_len: int = 256,
        batch_size: int = 16,
        val_batch_size: int | None = None,
        num_workers: int = 0,
        val_fraction: float = 0.05,
        val_source: str | list[str] | None = None,
        documents: str = "file",
        text_field: str = "text",
        shuffle: bool = True,
        seed: int = 42,
        prepare_workers: int = 1,
    ) -> None:
        super().__init__()
        if seq_len < 1 or batch_size < 1:
            raise ValueError(f"seq_len and batch_size must be positive, got {seq_len} and {batch_size}.")
        self.save_hyperparameters()
        self.data_dir = data_dir
        self.source = source
        self.tokenizer = tokenizer
        self.bpe_file = bpe_file
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.num_workers = num_workers
        self.shuffle = shuffle
        self.seed = seed
        self._vocab_size = vocab_size_of(tokenizer)  # validates the name now, without loading anything
        self.manifest: Manifest | None = None
        self.train_dataset = self.val_dataset = None

    @property
    def vocab_size(self) -> int:
        """Vocabulary size of the configured tokenizer (no I/O)."""
        return self._vocab_size

    @property
    def eos_id(self) -> int:
        return eos_id_of(self.tokenizer)

    @property
    def bytes_per_token(self) -> float | None:
        """UTF-8 bytes per token of the validation text (None before `setup`)."""
        return self.manifest.bytes_per_token("val") if self.manifest else None

    def prepare_data(self) -> None:
        if Manifest.exists(self.data_dir):
            return
        if self.source is None:
            raise FileNotFoundError(
                f"No token shards at {self.data_dir} and no data.source to prepare them from. Run "
                f"`lightning_cqk prepare --source <text> --output_dir {self.data_dir} --tokenizer {self.tokenizer}` "
                "or set data.source."
            )
        hp = self.hparams
        prepare(
            hp.source, self.data_dir, tokenizer=self.tokenizer, bpe_file=self.bpe_file, val_fraction=hp.val_fraction,
            val_source=hp.val_source, text_field=hp.text_field, documents=hp.documents,
            num_workers=hp.prepare_workers,
        )

    def setup(self, stage: str | None = None) -> None:
        from litdata import StreamingDataset, TokensLoader

        manifest = Manifest.load(self.data_dir)
        if manifest.tokenizer != self.tokenizer:
            raise ValueError(
                f"The shards at {self.data_dir} were made with tokenizer {manifest.tokenizer!r} (vocab "
                f"{manifest.vocab_size}), but data.tokenizer is {self.tokenizer!r} (vocab {self.vocab_size}). Use "
                "the matching tokenizer, or prepare the text into another data_dir with this tokenizer."
            )
        fingerprint = get_tokenizer(self.tokenizer, self.bpe_file).fingerprint
        if manifest.tokenizer_fingerprint != fingerprint:
            raise ValueError(
                f"The shards at {self.data_dir} were made with a different {self.tokenizer!r} vocabulary "
                f"(fingerprint {manifest.tokenizer_fingerprint[:12]} vs {fingerprint[:12]}). Check data.bpe_file, "
                "or re-run prepare into another data_dir."
            )
        window = self.seq_len + 1
        for split in ("train", "val"):
            if manifest.splits[split].tokens < window:
                raise ValueError(
                    f"The {split} split at {self.data_dir} has {manifest.splits[split].tokens} tokens, fewer than "
                    f"one window of seq_len + 1 = {window}. Use a shorter data.seq_len or more text."
                )
        self.manifest = manifest
        root = Path(self.data_dir)
        self.train_dataset = StreamingDataset(
            str(root / "train"), item_loader=TokensLoader(block_size=window), shuffle=self.shuffle, seed=self.seed,
            drop_last=True,
        )
        self.val_dataset = StreamingDataset(
            str(root / "val"), item_loader=TokensLoader(block_size=window), shuffle=False, drop_last=False
        )

    def train_dataloader(self):
        from litdata import StreamingDataLoader

        return StreamingDataLoader(
            self.train_dataset, batch_size=self.batch_size, num_workers=self.num_workers, drop_last=True,
            pin_memory=torch.cuda.is_available(), collate_fn=collate_tokens,
        )

    def val_dataloader(self):
        from litdata import StreamingDataLoader

        return StreamingDataLoader(
            self.val_dataset, batch_size=self.val_batch_size, num_workers=self.num_workers, drop_last=False,
            pin_memory=torch.cuda.is_available(), collate_fn=collate_tokens,
        )
