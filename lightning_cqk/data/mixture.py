"""A weighted mixture of corpora (litdata ``CombinedStreamingDataset``) for the domain-coherent vs heterogeneous
comparison: each component is a named corpus prepared into its own shard directory with the same tokenizer.

Training draws each window from component ``i`` with probability ``weight_i / sum(weights)`` (litdata samples the
component per window with a seeded generator, so the stream is reproducible and its state resumes exactly).
Validation reads every component's val split once (``iterate_over_all``), so ``val/loss`` is the token-weighted
loss over the union of the val splits, and ``bytes_per_token`` is that union's bytes over its tokens.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from lightning_cqk.data.datamodule import TokenDataModule, token_loader
from lightning_cqk.data.manifest import Manifest
from lightning_cqk.data.prepare_spec import PrepareSpec
from lightning_cqk.data.token_stream import LoaderSpec, TokenStreamDataModule
from lightning_cqk.errors import ConfigError


@dataclass
class MixtureComponent:
    """One corpus of a mixture.

    Attributes:
        corpus: a named corpus (``lightning_cqk.data.corpora``), e.g. ``pubmed`` or ``c4``.
        data_dir: where its shards are (prepared there from ``source`` when missing).
        source: local copy in the corpus's format; None: download when preparing.
        weight: relative sampling weight in training.
    """

    corpus: str
    data_dir: str
    source: str | list[str] | None = None
    weight: float = 1.0


class MixtureDataModule(TokenStreamDataModule):
    """Token windows drawn from several corpora by weight (training) and from all their val splits (validation).

    Args:
        components: the corpora and their weights.
        tokenizer, bpe_file, seq_len, batch_size, val_batch_size, num_workers, val_fraction, shuffle, seed,
            prepare_workers, max_documents, val_seq_len, cache_dir, other_files, val_overlap: as for
            ``TokenDataModule`` (shared by every component; each component caches under ``cache_dir/<index>``). A
            component whose ``data_dir`` holds shards of another source or tokenizer is refused like a
            ``TokenDataModule``'s.

    The arguments are flat because they are the ``data.*`` keys of a mixture config (LightningCLI reads this
    signature); each component gets its own ``PrepareSpec`` and this ``LoaderSpec`` (its own ``cache_dir/<index>``).
    """

    def __init__(
        self,
        components: list[MixtureComponent],
        tokenizer: str = "gpt2",
        bpe_file: str | None = None,
        seq_len: int = 1024,
        batch_size: int = 32,
        val_batch_size: int | None = None,
        num_workers: int = 0,
        val_fraction: float = 0.05,
        shuffle: bool = True,
        seed: int = 42,
        prepare_workers: int = 1,
        max_documents: int | None = None,
        val_seq_len: int | None = None,
        cache_dir: str | None = None,
        other_files: str = "refuse",
        val_overlap: str = "drop",
    ) -> None:
        if len(components) < 1:
            raise ConfigError("A mixture needs at least one component.")
        components = [c if isinstance(c, MixtureComponent) else MixtureComponent(**c) for c in components]
        if any(not 0 < c.weight < math.inf for c in components):
            raise ConfigError(f"Mixture weights must be positive and finite, got {[c.weight for c in components]}.")
        loading = LoaderSpec(seq_len, batch_size, val_batch_size, num_workers, shuffle, seed, val_seq_len, cache_dir)
        super().__init__(tokenizer, bpe_file, loading)
        self.save_hyperparameters()
        # Plain dicts in the checkpoint, not MixtureComponent objects: checkpoints load with weights_only=True.
        self.hparams["components"] = [asdict(c) for c in components]
        self.components = components
        # One TokenDataModule per component does the preparing, checking and dataset building.
        self.parts = [
            TokenDataModule.from_specs(
                PrepareSpec(
                    source=c.source,
                    output_dir=c.data_dir,
                    tokenizer=tokenizer,
                    bpe_file=bpe_file,
                    val_fraction=val_fraction,
                    num_workers=prepare_workers,
                    corpus=c.corpus,
                    max_documents=max_documents,
                    other_files=other_files,
                    val_overlap=val_overlap,
                ),
                replace(loading, cache_dir=None if cache_dir is None else f"{cache_dir}/{i}"),
            )
            for i, c in enumerate(components)
        ]

    @property
    def bytes_per_token(self) -> float | None:
        """UTF-8 bytes per token over the union of the components' val splits (None while any is missing)."""
        if not all(Manifest.exists(c.data_dir) for c in self.components):
            return None
        splits = [Manifest.load(c.data_dir).splits["val"] for c in self.components]
        return sum(s.bytes for s in splits) / max(1, sum(s.tokens for s in splits))

    def prepare_data(self) -> None:
        """Prepare every component that has no finished shards."""
        for part in self.parts:
            part.prepare_data()

    def setup(self, stage: str | None = None) -> None:
        """Build each component's datasets, then the weighted (train) and exhaustive (val) combinations."""
        from litdata import CombinedStreamingDataset

        for part in self.parts:
            part.trainer = self.trainer
            part.setup(stage)
        weights = [c.weight / sum(c.weight for c in self.components) for c in self.components]
        self.train_dataset = CombinedStreamingDataset(
            [p.train_dataset for p in self.parts], seed=self.seed, weights=weights, iterate_over_all=False
        )
        self.val_dataset = CombinedStreamingDataset([p.val_dataset for p in self.parts], iterate_over_all=True)
        self.fingerprints = {k: v for p in self.parts for k, v in p.fingerprints.items()}

    def teardown(self, stage: str | None = None) -> None:
        """Release every component's hold on its data folder."""
        for part in self.parts:
            part.teardown(stage)

    def train_dataloader(self):
        """Weighted training windows, ``(batch_size, seq_len + 1)`` int64."""
        where = ", ".join(p.data_dir for p in self.parts)
        return token_loader(self.train_dataset, self.batch_size, self.num_workers, True, self.vocab_size, where)

    def val_dataloader(self):
        """Every component's val windows, ``(val_batch_size, seq_len + 1)`` int64."""
        where = ", ".join(p.data_dir for p in self.parts)
        return token_loader(self.val_dataset, self.val_batch_size, self.num_workers, False, self.vocab_size, where)
