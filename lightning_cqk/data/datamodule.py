"""Streaming DataModule over prepared token shards (litdata ``StreamingDataset`` + ``TokensLoader``).

Each sample is a window of ``seq_len + 1`` consecutive tokens (inputs and next-token targets: the LightningModule
takes ``batch[:, :-1]`` and ``batch[:, 1:]``), cut from the token stream without overlap. litdata cuts windows
inside each chunk and drops the tail of every chunk that does not fill a whole window. Training windows are
shuffled with a seed; validation windows are read in order, so every run of an ablation sees the same validation
set. Lightning checkpoints the ``StreamingDataLoader`` state, so resumed runs continue where they stopped (with the
same ``num_workers``, devices and seed; litdata refuses other combinations).

A run owns what it reads (``folder_lock.py``): ``setup`` takes a shared hold on ``data_dir`` (waiting while a
``prepare`` builds it) and keeps it until ``teardown``, so no ``prepare`` can rebuild the folder under the run; it
records the shards' fingerprint (``integrity.shard_fingerprint``) for ``callbacks/data_guard.py``, which stops the run
when they change anyway (a file system without cross-host locks, a copy by hand).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

from lightning_cqk.data import remote
from lightning_cqk.data.builtin import builtin_name
from lightning_cqk.data.corpora import get_corpus, resolve_corpus
from lightning_cqk.data.folder_lock import ReaderHold, hold_for_reading
from lightning_cqk.data.integrity import (
    check_build,
    check_split,
    check_stream_end,
    check_token_range,
    rebuild_hint,
    shard_fingerprint,
)
from lightning_cqk.data.manifest import Manifest
from lightning_cqk.data.prepare import prepare_shards
from lightning_cqk.data.prepare_spec import PrepareSpec
from lightning_cqk.data.request import (
    Request,
    build_request,
    describe,
    differences,
    fingerprint_of,
    free_dir_beside,
    prepare_command,
)
from lightning_cqk.data.sources import as_source_list, list_source_files
from lightning_cqk.data.token_stream import LoaderSpec, TokenStreamDataModule
from lightning_cqk.errors import ConfigError, MissingInputError

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")  # litdata pings PyPI on import otherwise


def collate_tokens(items: list, vocab_size: int | None = None, where: str = "") -> torch.Tensor:
    """Stack token windows (numpy arrays or tensors, possibly uint16) into a ``(B, seq_len + 1)`` int64 batch.

    Converting here, once per batch, is cheaper than per window, and torch has few kernels for uint16. With
    ``vocab_size``, ids outside the vocabulary (damaged shard bytes) are refused (``integrity.check_token_range``).
    """
    batch = np.stack([np.asarray(item) for item in items])
    if vocab_size is not None:
        check_token_range(batch, vocab_size, where)
    return torch.from_numpy(batch.astype(np.int64))


def ignore_stop_signals(worker_id: int) -> None:
    """DataLoader `worker_init_fn`: each worker leaves the training process's process group, so that a signal sent to
    the whole group (`timeout`, `kill -- -PGID`, a scheduler, Ctrl-C in a terminal) reaches the training process
    alone, which stops at a batch boundary and saves, instead of failing with "DataLoader worker ... is killed by
    signal". The workers keep torch's SIGTERM handling, so the DataLoader's own shutdown (`terminate()` of a worker
    that does not exit in time, and multiprocessing's join at interpreter exit) still ends them: a worker that ignored
    SIGTERM instead would leave the training process waiting for it for ever. An orphaned worker notices that its
    parent is gone (torch's worker watchdog) and exits."""
    import os
    import signal

    if hasattr(os, "setpgid"):
        os.setpgid(0, 0)  # its own process group: group-wide signals no longer reach it
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C sent to it alone is the training process's to handle


_WORKER_NOTES: set[int] = set()


def note_worker_count(num_workers: int) -> None:
    """Say once per process when the DataLoader workers outnumber this machine's CPUs (torch warns at every loader
    it builds, three times a run; the command line hides that warning, `cli/warnings.py`)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if num_workers > cpus and num_workers not in _WORKER_NOTES:
        _WORKER_NOTES.add(num_workers)
        print(
            f"data: {num_workers} DataLoader workers (data.num_workers) on {cpus} CPUs share the cores with training; "
            f"--data.num_workers {cpus} matches this machine.",
            file=sys.stderr,
            flush=True,
        )


def token_loader(dataset, batch_size: int, num_workers: int, train: bool, vocab_size: int | None = None, where=""):
    """A StreamingDataLoader of int64 token windows: training drops partial batches, validation keeps every window."""
    from litdata import StreamingDataLoader

    note_worker_count(num_workers)

    return StreamingDataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        drop_last=train,
        pin_memory=torch.cuda.is_available(),
        collate_fn=partial(collate_tokens, vocab_size=vocab_size, where=str(where)),
        worker_init_fn=ignore_stop_signals if num_workers > 0 else None,
    )


def count_windows(split_dir: str | Path, window: int) -> int:
    """Windows of ``window`` tokens litdata's ``TokensLoader`` cuts from a split (per-chunk tails dropped)."""
    index_path = remote.join(split_dir, "index.json")
    index = json.loads(remote.read_text(index_path) if remote.is_remote(split_dir) else Path(index_path).read_text())
    return sum(chunk["dim"] // window for chunk in index["chunks"])


def _check_numbers(num_workers, prepare_workers, val_fraction, max_documents, val_seq_len) -> None:
    """Refuse DataModule numbers that cannot mean what they say (issue 13, class 10)."""
    problems = []
    if not (isinstance(num_workers, int) and num_workers >= 0):
        problems.append(f"data.num_workers={num_workers!r} must be an integer >= 0 (0: load in the main process)")
    if not (isinstance(prepare_workers, int) and prepare_workers >= 1):
        problems.append(f"data.prepare_workers={prepare_workers!r} must be an integer >= 1")
    if not 0.0 <= val_fraction < 1.0:  # NaN fails this too
        problems.append(f"data.val_fraction={val_fraction!r} must be in [0, 1) (the share of documents for val)")
    if max_documents is not None and not (isinstance(max_documents, int) and max_documents >= 1):
        problems.append(f"data.max_documents={max_documents!r} must be >= 1, or null for all rows")
    if val_seq_len is not None and not (isinstance(val_seq_len, int) and val_seq_len >= 1):
        problems.append(f"data.val_seq_len={val_seq_len!r} must be >= 1, or null for data.seq_len")
    if problems:
        raise ConfigError("; ".join(problems) + ".")


def _split_cache(cache_dir: str | None, split: str) -> str | None:
    """One cache folder per split: litdata keys a cache by folder, and two splits must not share one."""
    return None if cache_dir is None else str(Path(cache_dir) / split)


class TokenDataModule(TokenStreamDataModule):
    """Token windows for next-token prediction, streamed from ``data_dir`` (prepared from ``source`` if missing).

    Args:
        data_dir: directory with ``train/``, ``val/`` and ``manifest.json`` (see ``lightning_cqk prepare``).
        source: text to prepare from when ``data_dir`` has no finished shards (file, directory, glob, list, or
            ``builtin:python_docs``); None means the shards must already exist.
        tokenizer: ``bytes`` or ``gpt2``; must match the tokenizer the shards were made with.
        bpe_file: local GPT-2 ``.tiktoken`` file for offline use (default: $LIGHTNING_CQK_GPT2_BPE).
        seq_len: tokens per training sequence (the model's block_size is linked to it).
        batch_size: sequences per training batch (per device).
        val_batch_size: sequences per validation batch (default: batch_size).
        num_workers: DataLoader worker processes.
        val_fraction: fraction of documents for validation when preparing.
        val_source: separate validation text when preparing.
        documents: what a document is in plain-text sources when preparing: ``file``, ``paragraph`` or ``line``.
        text_field: JSON-lines field holding the text when preparing.
        shuffle: shuffle training windows.
        seed: shuffle seed of the training stream.
        prepare_workers: processes used by prepare.
        corpus: a named corpus (``wikitext103``, ``wikitext2``, ``pubmed``, ``openwebtext``, ``c4``, ``slimpajama``,
            ``text``; see ``lightning_cqk.data.corpora``): ``source`` is then a local copy in that corpus's format,
            its own train/valid files are kept as splits, and with ``source: null`` it is downloaded when preparing.
        max_documents: when a corpus is downloaded, at most this many rows of each online split.
        val_seq_len: tokens per validation sequence (default: seq_len); longer than seq_len for evaluation at several
            context lengths with a sliding window (``model.eval_contexts``), which never feeds the model more than
            its block_size at once.
        cache_dir: where litdata caches chunks streamed from an ``s3://`` data_dir (default: litdata's, under
            ``~/.lightning/chunks``); put it on fast local disk on clusters.
        other_files: with a corpus whose files name their splits, what to do with files that name none:
            ``refuse`` (default), ``train``, ``hash`` or ``leave_out`` (see ``lightning_cqk.data.corpora``).
        val_overlap: with explicit validation text (``val_source`` or a corpus's val files), training documents
            equal to a validation document are left out (``drop``, default, counted in the manifest) or kept.
        final_val_windows: the windows (the first N of the val split) the validation at the run's last step
            scores, while every other validation scores the ``trainer.limit_val_batches`` subset
            (``lightning_cqk.data.val_sets``); null (default): every validation scores the same windows. Refused
            when the split has fewer windows.

    When ``data_dir`` already holds finished shards, ``source`` (with ``corpus``, ``val_source``, ``documents``,
    ``text_field``, ``val_fraction``) and ``tokenizer`` must be what they were made from, else the run is refused
    naming both (``source: null`` trains on whatever shards are there).

    The arguments are flat because they are the ``data.*`` keys of the command line and configs (LightningCLI reads
    this signature); they become a ``PrepareSpec`` (``prepare_spec``) and a ``LoaderSpec`` (``token_stream.py``).
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
        corpus: str | None = None,
        max_documents: int | None = None,
        val_seq_len: int | None = None,
        cache_dir: str | None = None,
        other_files: str = "refuse",
        val_overlap: str = "drop",
        final_val_windows: int | None = None,
    ) -> None:
        if seq_len < 1 or batch_size < 1 or (val_batch_size is not None and val_batch_size < 1):
            raise ConfigError(
                f"seq_len and batch sizes must be positive, got {seq_len}, {batch_size}, {val_batch_size}."
            )
        _check_numbers(num_workers, prepare_workers, val_fraction, max_documents, val_seq_len)
        if final_val_windows is not None and not (isinstance(final_val_windows, int) and final_val_windows >= 1):
            raise ConfigError(
                f"data.final_val_windows={final_val_windows!r} must be a whole number of windows >= 1, or null for "
                "the same validation set at every validation."
            )
        loading = LoaderSpec(seq_len, batch_size, val_batch_size, num_workers, shuffle, seed, val_seq_len, cache_dir)
        super().__init__(tokenizer, bpe_file, loading)
        self.save_hyperparameters()
        self.val_seq_len = val_seq_len or seq_len
        self.cache_dir = cache_dir
        self.shuffle = shuffle
        self.final_val_windows = final_val_windows
        if corpus is not None:
            get_corpus(corpus)  # an unknown name fails at parse time, listing the known ones
        # Built from the arguments, not self.hparams: a TokenDataModule built inside another DataModule's __init__ (a
        # mixture) would get the outer one's arguments from save_hyperparameters' frame inspection.
        self.prepare_spec = PrepareSpec(
            source=source,
            output_dir=data_dir,
            tokenizer=tokenizer,
            bpe_file=bpe_file,
            val_fraction=val_fraction,
            val_source=val_source,
            text_field=text_field,
            documents=documents,
            num_workers=prepare_workers,
            corpus=corpus,
            max_documents=max_documents,
            other_files=other_files,
            val_overlap=val_overlap,
        )
        self.manifest: Manifest | None = None
        self.train_dataset = None
        self.val_dataset = None
        self.fingerprints: dict[str, dict[str, str]] = {}  # data_dir -> shard_fingerprint at setup
        self._hold: ReaderHold | None = None
        self._checked_build: str | None = None  # the build whose source prepare_data compared
        self._windows: dict[str, int] = {}
        self._val_limit = None  # the trainer's limit_val_batches, consumed by val_dataloader (data/val_split.py)

    @classmethod
    def from_specs(cls, spec: PrepareSpec, loading: LoaderSpec) -> TokenDataModule:
        """The TokenDataModule of a prepare spec and a loader spec (a mixture's component), through the same checks
        as its arguments; ``spec.chunk_bytes`` and ``spec.overwrite`` are not DataModule settings and are not used."""
        return cls(
            data_dir=spec.output_dir,
            source=spec.source,
            tokenizer=spec.tokenizer,
            bpe_file=spec.bpe_file,
            val_fraction=spec.val_fraction,
            val_source=spec.val_source,
            documents=spec.documents,
            text_field=spec.text_field,
            prepare_workers=spec.num_workers,
            corpus=spec.corpus,
            max_documents=spec.max_documents,
            other_files=spec.other_files,
            val_overlap=spec.val_overlap,
            **asdict(loading),
        )

    @property
    def data_dir(self) -> str:
        """Where the shards are (``prepare_spec.output_dir``)."""
        return self.prepare_spec.output_dir

    @property
    def source(self) -> str | list[str] | None:
        """The text the shards are prepared from (None: whatever shards are there)."""
        return self.prepare_spec.source

    @property
    def corpus(self) -> str | None:
        """The named corpus of ``source``, if any."""
        return self.prepare_spec.corpus

    @property
    def bytes_per_token(self) -> float | None:
        """UTF-8 bytes per token of the validation text, for bits per byte (None while no shards exist)."""
        if self.manifest is None and Manifest.exists(self.data_dir):
            self.manifest = Manifest.load(self.data_dir)
        return self.manifest.bytes_per_token("val") if self.manifest else None

    def prepare_data(self) -> None:
        """Build the shards from ``source`` unless ``data_dir`` already holds finished ones made from it.

        Raises:
            ValueError: ``data_dir`` holds finished shards made from another source, tokenizer or settings; the
                message names both and the fixes.
        """
        if Manifest.exists(self.data_dir):
            manifest = Manifest.load(self.data_dir)
            self._check_source(manifest)
            self._checked_build = manifest.extra.get("build_id")
            return
        if self.source is None and self.corpus is None:
            raise MissingInputError(
                f"No token shards at {self.data_dir} (no manifest.json) and no data.source to prepare them from. Run "
                f"`lightning_cqk prepare --source <text> --output_dir {self.data_dir} --tokenizer {self.tokenizer}`, "
                "or set data.source."
            )
        prepare_shards(self.prepare_spec)

    def setup(self, stage: str | None = None) -> None:
        """Check the shards against this configuration and build the streaming datasets."""
        from litdata import StreamingDataset, TokensLoader

        if remote.is_remote(self.data_dir):
            remote.allow_http_endpoints()  # before litdata builds its S3 stores (inherited by forked workers)
        elif self._hold is None or self._hold.released:  # held until teardown: no prepare rebuilds it under the run
            self._hold = hold_for_reading(self.data_dir)
        manifest = Manifest.load(self.data_dir)
        build = manifest.extra.get("build_id")
        if build != self._checked_build and Manifest.exists(self.data_dir):
            self._check_source(manifest)  # rebuilt since prepare_data compared it (or compared by another rank)
            self._checked_build = build
        check_build(self.data_dir, build, self.tokenizer)
        self._check_tokenizer(manifest)
        window, val_window = self.seq_len + 1, self.val_seq_len + 1
        world = self.trainer.world_size if self.trainer is not None else 1
        need = {"train": self.batch_size * world, "val": world}  # drop_last batches / one window per rank
        for split in ("train", "val"):
            index = check_split(self.data_dir, split, self.tokenizer)  # a missing, truncated or corrupt shard fails
            check_stream_end(self.data_dir, split, index, self.eos_id, manifest.dtype, self.tokenizer)
            size = window if split == "train" else val_window
            tokens, windows = manifest.splits[split].tokens, count_windows(remote.join(self.data_dir, split), size)
            self._windows[split] = windows
            if windows < need[split]:
                raise ConfigError(
                    f"The {split} split at {self.data_dir} has {tokens:,} tokens, which give {windows} window(s) of "
                    f"seq_len + 1 = {size} tokens (litdata drops each chunk's tail); at least {need[split]} "
                    f"{'(batch_size x devices) ' if split == 'train' else ''}needed. Use a shorter data.seq_len, a "
                    f"smaller batch, or more text (a larger val_fraction or a val_source for val)."
                )
        if self.final_val_windows is not None and self.final_val_windows > self._windows["val"]:
            raise ConfigError(
                f"data.final_val_windows={self.final_val_windows}: the val split at {self.data_dir} has "
                f"{manifest.splits['val'].tokens:,} tokens, which give only {self._windows['val']} windows of "
                f"val_seq_len + 1 = {val_window} tokens. Ask for at most {self._windows['val']}, or give validation "
                "more text (a larger data.val_fraction, or a data.val_source), prepared into a new data_dir."
            )
        self.manifest = manifest
        self.fingerprints = {str(self.data_dir): shard_fingerprint(self.data_dir)}
        self.train_dataset = StreamingDataset(
            remote.join(self.data_dir, "train"),
            cache_dir=_split_cache(self.cache_dir, "train"),
            item_loader=TokensLoader(block_size=window),
            shuffle=self.shuffle,
            seed=self.seed,
            drop_last=True,
        )
        self.val_dataset = StreamingDataset(
            remote.join(self.data_dir, "val"),
            cache_dir=_split_cache(self.cache_dir, "val"),
            item_loader=TokensLoader(block_size=val_window),
            shuffle=False,
            drop_last=False,
        )

    def teardown(self, stage: str | None = None) -> None:
        """Let writers in again: the run no longer reads ``data_dir``."""
        if self._hold is not None:
            self._hold.release()
            self._hold = None

    def train_dataloader(self):
        """Shuffled training windows, ``(batch_size, seq_len + 1)`` int64; partial batches dropped."""
        return token_loader(self.train_dataset, self.batch_size, self.num_workers, True, self.vocab_size, self.data_dir)

    def val_dataloader(self):
        """This rank's share of the validation windows, in order, ``(val_batch_size, seq_len + 1)`` int64; the last
        batch may be short. The same windows whatever the number of processes (`data/val_split.py`). With
        ``final_val_windows``: the subset's loader and the final set's, chosen as each validation starts
        (`data/val_sets.py`)."""
        from lightning_cqk.data.val_split import ValWindowShare, share, validation_windows

        trainer = self.trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        if trainer is not None and self._val_limit is None:
            self._val_limit = trainer.limit_val_batches
            if isinstance(self._val_limit, float) and 0.0 < self._val_limit < 1.0:
                trainer.limit_val_batches = 1.0  # applied here, to the whole set: Lightning must not cut each share
        total = self._windows.get("val") or count_windows(remote.join(self.data_dir, "val"), self.val_seq_len + 1)
        n = validation_windows(total, self._val_limit, self.val_batch_size)
        if world > 1 and n < world:
            raise ConfigError(
                f"Validation would score {n} window(s) of {self.data_dir}/val on {world} processes; every process "
                f"needs at least one. Raise trainer.limit_val_batches (now {self._val_limit}) or validate with fewer "
                "processes."
            )
        start, stop = share(n, world, rank)
        loader = self._val_loader(ValWindowShare(self.val_dataset, start, stop, self.val_batch_size))
        if self.final_val_windows is None or trainer is None or self._val_limit == 0:
            return loader
        from lightning_cqk.data.val_sets import ValidationSets, is_final_validation

        trainer.limit_val_batches = 1.0  # the final set is longer than the subset: Lightning must not cut it
        start, stop = share(self.final_val_windows, world, rank)
        final = self._val_loader(ValWindowShare(self.val_dataset, start, stop, self.val_batch_size))
        return ValidationSets(loader, final, lambda: is_final_validation(trainer))

    def _val_loader(self, windows):
        """The DataLoader of one rank's validation windows (in order, the last batch possibly short)."""
        from torch.utils.data import DataLoader

        note_worker_count(self.num_workers)
        return DataLoader(
            windows,
            batch_size=self.val_batch_size,
            num_workers=self.num_workers,
            pin_memory=torch.cuda.is_available(),
            collate_fn=partial(collate_tokens, vocab_size=self.vocab_size, where=str(self.data_dir)),
            worker_init_fn=ignore_stop_signals if self.num_workers > 0 else None,
        )

    def _request(self) -> Request:
        """What this DataModule would prepare, in the manifest's terms (nothing is read but file sizes)."""
        spec = self.prepare_spec
        fingerprint = fingerprint_of(self.tokenizer, self.bpe_file, self.data_dir)
        if self.corpus is not None:
            corpus = get_corpus(self.corpus)
            spec = replace(spec, documents=corpus.documents, text_field=corpus.text_field)
            if spec.source is not None:
                try:
                    resolved = resolve_corpus(
                        self.corpus, spec.source, other_files=spec.other_files, count_documents=False
                    )
                except FileNotFoundError:  # not readable here: compared by name below
                    resolved = None
                if resolved is not None:
                    spec = replace(spec, source=resolved.source, val_source=resolved.val_source)
        try:
            return build_request(spec, fingerprint)
        except (FileNotFoundError, ValueError):  # the source is not here (shards made elsewhere): compare by name
            return build_request(spec, fingerprint, listable=False)

    def _refuse_a_missing_source(self, manifest: Manifest) -> None:
        """Shards of another source, and the source asked for is not on this machine: say that first (it is the
        mistake; shards compared by name are only for shards made elsewhere from the same source)."""
        if self.source is None or self.corpus is not None:
            return
        if any(remote.is_remote(spec) for spec in as_source_list(self.source)):
            return
        try:
            list_source_files(self.source)
        except MissingInputError as err:
            raise MissingInputError(
                f"{err} (data.data_dir={self.data_dir} holds shards of {describe(manifest)}; to train on those as "
                "they are: --data.source null)"
            ) from None

    def _check_source(self, manifest: Manifest) -> None:
        """Refuse shards made from another source/tokenizer/settings than asked for (``source: null``: any)."""
        if self.source is None and self.corpus is None:
            return
        differ = differences(manifest, self._request())
        record = Path(str(self.data_dir)) / "raw" / ".download.json"  # a corpus downloaded by prepare
        if self.source is None and not remote.is_remote(self.data_dir) and record.is_file():
            done = json.loads(record.read_text()).get("max_documents")
            if done != self.prepare_spec.max_documents:
                differ.append(f"max_documents: downloaded {done}, asked {self.prepare_spec.max_documents}")
        if not differ:
            return
        self._refuse_a_missing_source(manifest)
        spec = self.prepare_spec
        first = as_source_list(self.source)[0] if self.source is not None else self.corpus
        stem = builtin_name(first) or Path(str(first).rstrip("/")).stem or "data"
        settings = dict(
            tokenizer=self.tokenizer,
            bpe_file=self.bpe_file,
            corpus=self.corpus,
            other_files=spec.other_files if self.corpus is not None and spec.other_files != "refuse" else None,
            val_source=spec.val_source,
            val_fraction=spec.val_fraction if spec.val_fraction != 0.05 else None,
            documents=spec.documents if self.corpus is None and spec.documents != "file" else None,
            text_field=spec.text_field if self.corpus is None and spec.text_field != "text" else None,
            max_documents=spec.max_documents,
            val_overlap=spec.val_overlap if spec.val_overlap != "drop" else None,
            overwrite=True,
        )
        asked = f"corpus {self.corpus!r} from " if self.corpus else ""
        asked += f"{self.source!r}" if self.source is not None else "its download"
        raise ConfigError(
            f"data.source does not match the shards in data.data_dir={self.data_dir}: they were made from "
            f"{describe(manifest)}, but this run asks for {asked} with tokenizer {self.tokenizer!r} "
            f"({'; '.join(differ)}). Training on them would silently ignore what was asked. Either prepare it into "
            f"its own directory: --data.data_dir {free_dir_beside(self.data_dir, f'{stem}-{self.tokenizer}')}; or "
            "train on the existing shards as they are: --data.source null; or rebuild "
            f"{self.data_dir} in place (no other run may be reading it; only prepare's own files are replaced): "
            f"{prepare_command(self.data_dir, self.source, **settings)}"
        )

    def _check_tokenizer(self, manifest: Manifest) -> None:
        if manifest.tokenizer != self.tokenizer:
            raise ConfigError(
                f"The shards at {self.data_dir} were made with tokenizer {manifest.tokenizer!r} (vocab "
                f"{manifest.vocab_size}), but data.tokenizer is {self.tokenizer!r} (vocab {self.vocab_size}). Use "
                f"data.tokenizer={manifest.tokenizer!r}, or re-run prepare with {self.tokenizer!r} into another "
                "data_dir."
            )
        # Compared without loading the vocabulary where its fingerprint is a known constant (bytes, gpt2): a
        # manifest edited by hand is caught offline too. Otherwise the vocabulary must load, or the run is refused.
        fingerprint = fingerprint_of(self.tokenizer, self.bpe_file, self.data_dir)
        if manifest.tokenizer_fingerprint != fingerprint:
            raise ConfigError(
                f"The shards at {self.data_dir} were made with a different {self.tokenizer!r} vocabulary "
                f"(fingerprint {manifest.tokenizer_fingerprint[:12]}, this one {fingerprint[:12]}): the manifest was "
                "edited, or another vocabulary file was used. Check data.bpe_file, or re-run prepare into another "
                "data_dir."
            )
        if (manifest.vocab_size, manifest.eos_id) != (self.vocab_size, self.eos_id):
            raise ConfigError(
                f"The manifest of {self.data_dir} records vocab_size {manifest.vocab_size} and eos_id "
                f"{manifest.eos_id}, but tokenizer {self.tokenizer!r} has {self.vocab_size} and {self.eos_id}: the "
                f"manifest was edited by hand. {rebuild_hint(self.data_dir, self.tokenizer)}"
            )
