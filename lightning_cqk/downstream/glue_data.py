"""GLUE as a LightningDataModule: read a task (``glue_tasks.load_task``), tokenise it with the checkpoint's tokenizer.

Each example becomes one token sequence for a causal LM:

    sentence:       ids(text_a) [EOS]
    sentence pair:  ids(text_a) SEP ids(text_b) [EOS]

``SEP`` is the tokenizer's end-of-document id (``separator: eos``, the default: the boundary the LM learned during
pre-training) or the ids of any text (``separator: "\\n"``). The closing EOS (``append_eos``, default true) gives
last-token pooling a position that has read the whole input. Sequences longer than ``max_length`` (default: the
model's ``block_size``) are cut from the end, longest text first (the pair's longer text loses tokens until the pair
fits or both are equally long), so the separator and the EOS always survive.

Batches are dicts: ``input_ids`` (B, T) int64 right-padded with 0, ``lengths`` (B,) int64, ``labels`` (B,) int64 or
fp32 (STS-B). Right padding is invisible to a causal model: no real token attends to a later position.

Tokenizer and ``max_length`` left unset are taken at ``setup`` from the model being trained (the
``GlueClassifier``), so the data can never be tokenised differently from the checkpoint.
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader

from lightning_cqk.data.datamodule import ignore_stop_signals
from lightning_cqk.data.tokenizers import Tokenizer, get_tokenizer
from lightning_cqk.downstream.glue_tasks import Example, TaskData, get_task, load_task


def truncate_pair(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """Lengths to keep of two texts so they fit ``budget`` tokens, cutting the longer one first ("longest first")."""
    if len_a + len_b <= budget:
        return len_a, len_b
    keep_b = min(len_b, max(budget - len_a, budget // 2))
    return min(len_a, budget - keep_b), keep_b


def encode_example(
    tokenizer: Tokenizer, example: Example, max_length: int, separator: str = "eos", append_eos: bool = True
) -> tuple[list[int], bool]:
    """Token ids of an example (see the module docstring) and whether it was truncated."""
    a = tokenizer.encode(example.text_a)
    end = [tokenizer.eos_id] if append_eos else []
    if example.text_b is None:
        budget = max_length - len(end)
        return a[:budget] + end, len(a) > budget
    sep = [tokenizer.eos_id] if separator == "eos" else tokenizer.encode(separator)
    b = tokenizer.encode(example.text_b)
    budget = max_length - len(sep) - len(end)
    if budget < 2:
        raise ValueError(f"max_length {max_length} leaves no room for a sentence pair with its separator and EOS.")
    keep_a, keep_b = truncate_pair(len(a), len(b), budget)
    return a[:keep_a] + sep + b[:keep_b] + end, (keep_a, keep_b) != (len(a), len(b))


def fixed_subset(examples: list[Example], n: int | None, seed: int) -> list[Example]:
    """``n`` examples drawn without replacement by ``seed``, in their original order (all when ``n`` is None)."""
    if n is None or n >= len(examples):
        return examples
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed))
    return [examples[i] for i in sorted(order[:n].tolist())]


def collate(items: list[tuple[list[int], int | float]]) -> dict[str, torch.Tensor]:
    """Right-pad token lists into a batch dict (see the module docstring)."""
    lengths = torch.tensor([len(ids) for ids, _ in items], dtype=torch.int64)  # (B,)
    input_ids = torch.zeros(len(items), int(lengths.max()), dtype=torch.int64)  # (B, T)
    for i, (ids, _) in enumerate(items):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
    labels = [label for _, label in items]
    dtype = torch.float32 if isinstance(labels[0], float) else torch.int64
    return {"input_ids": input_ids, "lengths": lengths, "labels": torch.tensor(labels, dtype=dtype)}


class GlueDataModule(L.LightningDataModule):
    """One GLUE task, tokenised for a pretrained causal LM.

    Args:
        task: ``cola``, ``sst2``, ``mrpc``, ``stsb``, ``qqp``, ``mnli``, ``qnli``, ``rte`` or ``wnli``.
        data_dir: folder holding one sub-folder per task (``CoLA/``, ``SST-2/``, ...) in the GLUE layout or the
            original releases' (see ``lightning_cqk.downstream.glue_tasks``).
        source: ``auto`` (local files, else the Hugging Face hub when ``datasets`` is installed), ``files`` or ``hf``.
        tokenizer: tokenizer name; None: the model's (the checkpoint's training tokenizer). Set it only to use the
            data module without a model.
        bpe_file: local vocabulary file for a named BPE tokenizer.
        max_length: longest sequence in tokens; None: the model's block_size.
        batch_size: training examples per batch.
        eval_batch_size: evaluation examples per batch (default: 2 x batch_size).
        separator: ``eos`` (the EOS id) or text placed between the two sentences of a pair.
        append_eos: end every sequence with EOS.
        heldout_fraction: part of train held out for evaluation when a task has no labelled dev split.
        max_train_examples: keep only this many training examples (a fixed random subset; None: all).
        max_eval_examples: evaluate on a fixed random subset of this many examples of each split (None: all); the
            subset depends only on the split (seed 0), so every run and every checkpoint sees the same examples.
        seed: seed of the training order and of the max_train_examples subset.
        num_workers: DataLoader workers.
    """

    def __init__(
        self,
        task: str = "sst2",
        data_dir: str | None = None,
        source: str = "auto",
        tokenizer: str | None = None,
        bpe_file: str | None = None,
        max_length: int | None = None,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        separator: str = "eos",
        append_eos: bool = True,
        heldout_fraction: float = 0.1,
        max_train_examples: int | None = None,
        max_eval_examples: int | None = None,
        seed: int = 1234,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.task = get_task(task)  # an unknown name fails at parse time
        if batch_size < 1 or (eval_batch_size is not None and eval_batch_size < 1):
            raise ValueError(f"batch sizes must be positive, got {batch_size} and {eval_batch_size}.")
        if separator == "":
            raise ValueError("separator must be 'eos' or non-empty text; an empty one would glue the sentences.")
        self.data_dir, self.source = data_dir, source
        self.tokenizer_name, self.bpe_file, self.max_length = tokenizer, bpe_file, max_length
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or 2 * batch_size
        self.separator, self.append_eos = separator, append_eos
        self.heldout_fraction = heldout_fraction
        self.max_train_examples, self.max_eval_examples = max_train_examples, max_eval_examples
        self.seed, self.num_workers = seed, num_workers
        self.data: TaskData | None = None
        self.train_items: list[tuple[list[int], int | float]] = []
        self.eval_items: dict[str, list[tuple[list[int], int | float]]] = {}
        self.truncated = 0

    @property
    def eval_splits(self) -> tuple[str, ...]:
        return self.task.eval_splits

    def _resolve_tokenizer(self) -> tuple[Tokenizer, int]:
        model = self.trainer.lightning_module if self.trainer is not None else None
        tokenizer = getattr(model, "tokenizer", None)
        if self.tokenizer_name is not None:
            own = get_tokenizer(self.tokenizer_name, self.bpe_file)
            if tokenizer is not None and own.fingerprint != tokenizer.fingerprint:
                raise ValueError(
                    f"data.tokenizer {self.tokenizer_name!r} is not the tokenizer of the model's checkpoint "
                    f"({tokenizer.name!r}); leave data.tokenizer unset so the checkpoint's is used."
                )
            tokenizer = own
        if tokenizer is None:
            raise ValueError("GlueDataModule needs a tokenizer: set data.tokenizer, or train a GlueClassifier with it.")
        max_length = self.max_length or getattr(getattr(model, "config", None), "block_size", None)
        if max_length is None:
            raise ValueError("GlueDataModule needs max_length (or a model whose config has block_size).")
        block = getattr(getattr(model, "config", None), "block_size", None)
        if block is not None and max_length > block:
            raise ValueError(f"data.max_length {max_length} exceeds the model's block_size {block}.")
        return tokenizer, max_length

    def setup(self, stage: str | None = None) -> None:
        """Read and tokenise the task (once)."""
        if self.data is not None:
            return
        tokenizer, max_length = self._resolve_tokenizer()
        data = load_task(self.task.name, self.data_dir, self.source, self.heldout_fraction)
        train = data.train
        if self.max_train_examples is not None and self.max_train_examples < len(train):
            train = fixed_subset(train, self.max_train_examples, self.seed)
        self.truncated = 0

        def encode(examples: list[Example]) -> list[tuple[list[int], int | float]]:
            items = []
            for example in examples:
                ids, cut = encode_example(tokenizer, example, max_length, self.separator, self.append_eos)
                self.truncated += cut
                items.append((ids, example.label))
            return items

        self.train_items = encode(train)
        # Evaluation order does not change the metrics; sorted by length, batches carry little padding.
        self.eval_items = {
            s: sorted(encode(fixed_subset(data.evals[s], self.max_eval_examples, 0)), key=lambda item: len(item[0]))
            for s in self.task.eval_splits
        }
        if not self.train_items or any(not v for v in self.eval_items.values()):
            raise ValueError(f"GLUE {self.task.name}: an empty split ({data.provenance}; eval {data.eval_notes}).")
        self.data = data

    def summary(self) -> str:
        """One line on what was read: sources, sizes, truncation."""
        if self.data is None:
            return f"GLUE {self.task.name}: not set up"
        evals = ", ".join(f"{s}: {n}" for s, n in self.data.eval_notes.items())
        return (
            f"GLUE {self.task.name}: {self.data.provenance}; eval {evals}; "
            f"{len(self.train_items)} train examples used; "
            f"{self.truncated} sequences truncated; {self.data.skipped_rows} malformed/unlabelled rows skipped"
        )

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(
            self.train_items,
            batch_size=self.batch_size,
            shuffle=True,
            drop_last=len(self.train_items) >= self.batch_size,
            collate_fn=collate,
            generator=generator,
            num_workers=self.num_workers,
            worker_init_fn=ignore_stop_signals if self.num_workers > 0 else None,  # signals reach the trainer alone
        )

    def _eval_loaders(self) -> list[DataLoader]:
        return [
            DataLoader(
                items,
                batch_size=self.eval_batch_size,
                collate_fn=collate,
                num_workers=self.num_workers,
                worker_init_fn=ignore_stop_signals if self.num_workers > 0 else None,
            )
            for items in self.eval_items.values()
        ]

    def val_dataloader(self) -> list[DataLoader]:
        """One loader per evaluation split (MNLI: matched, mismatched), in ``task.eval_splits`` order."""
        return self._eval_loaders()

    def test_dataloader(self) -> list[DataLoader]:
        """The evaluation splits again (GLUE's test labels are not public)."""
        return self._eval_loaders()
