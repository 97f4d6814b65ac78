"""Fine-tune a pretrained LM checkpoint on a GLUE task: the LightningModule (pooling, head, loss, official metrics).

    input_ids (B, T) -> pretrained GPT hidden states (B, T, C) -> pool (B, C) -> dropout -> Linear -> (B, num_labels)

Pooling (``pooling``): ``last``, the hidden state of each sequence's last real token (with the default closing EOS,
the position that has read the whole input: the natural summary of a causal model); or ``mean``, the mean over the
real tokens. Loss: cross-entropy, or mean squared error for STS-B (one output, the 0-5 score). The whole network is
fine-tuned (``freeze_backbone: false``) with AdamW, linear warmup and cosine decay over the run (``trainer.max_steps``,
or ``max_epochs`` x batches per epoch).

Metrics (TensorBoard names): ``train/loss``; ``val/loss``, ``val/<metric>`` (``val/mcc``, ``val/acc``, ``val/f1``,
``val/pearson``, ``val/spearman``) and ``val/score`` (their mean); MNLI logs ``val/matched/acc`` and
``val/mismatched/acc``; ``lightning_cqk test`` logs the same under ``test/``. After every evaluation,
``final_metrics`` holds those numbers as plain floats (what ``lightning_cqk glue`` collects). Values are fractions;
tables multiply by 100.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.aggregation import SumMetric

from lightning_cqk.downstream.glue_metrics import build_metrics, predictions, task_score
from lightning_cqk.downstream.glue_tasks import get_task
from lightning_cqk.inference.pretrained import load_pretrained
from lightning_cqk.optim import warmup_cosine, weight_decay_groups

POOLINGS = ("last", "mean")


def pool(hidden: torch.Tensor, lengths: torch.Tensor, pooling: str) -> torch.Tensor:
    """Hidden states (B, T, C) of right-padded sequences with ``lengths`` (B,) -> (B, C)."""
    if pooling == "last":
        index = (lengths - 1).view(-1, 1, 1).expand(-1, 1, hidden.size(-1))  # (B, 1, C)
        return hidden.gather(1, index).squeeze(1)  # (B, C)
    if pooling == "mean":
        mask = torch.arange(hidden.size(1), device=hidden.device)[None, :] < lengths[:, None]  # (B, T)
        summed = (hidden * mask.unsqueeze(-1).to(hidden.dtype)).sum(dim=1)  # (B, C)
        return summed / lengths[:, None].to(hidden.dtype)  # (B, C)
    raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}.")


class GlueClassifier(L.LightningModule):
    """A pretrained `LitLM` checkpoint (any attention backend) with a classification or regression head.

    Args:
        checkpoint: the LM's ``.ckpt`` (``runs/<experiment>/<run>/checkpoints/last.ckpt``).
        task: the GLUE task (linked from ``data.task`` by the CLI); sets the head's size, the loss and the metrics.
        pooling: ``last`` (default) or ``mean`` (see the module docstring).
        head_dropout: dropout on the pooled state before the head.
        lr: peak learning rate (backbone and head).
        weight_decay: AdamW decoupled weight decay on matrices.
        warmup_steps: linear warmup steps.
        min_lr_ratio: the cosine decays to ``lr * min_lr_ratio`` at the last step.
        freeze_backbone: train only the head (a linear probe).
        tokenizer: the checkpoint's tokenizer name; None (default) reads it from the checkpoint. A different one is
            refused.
        bpe_file: local vocabulary file for a BPE tokenizer (default: the recorded one, or $LIGHTNING_CQK_GPT2_BPE).
    """

    def __init__(
        self,
        checkpoint: str | None = None,
        task: str = "sst2",
        pooling: str = "last",
        head_dropout: float = 0.1,
        lr: float = 1e-4,
        weight_decay: float = 0.01,
        warmup_steps: int = 10,
        min_lr_ratio: float = 0.0,
        freeze_backbone: bool = False,
        tokenizer: str | None = None,
        bpe_file: str | None = None,
    ) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}.")
        if checkpoint is None:
            raise ValueError(
                "GlueClassifier needs the pretrained LM checkpoint: --model.checkpoint runs/<experiment>/<run>/"
                "checkpoints/last.ckpt"
            )
        self.save_hyperparameters()
        self.task = get_task(task)
        pretrained = load_pretrained(checkpoint, tokenizer=tokenizer, bpe_file=bpe_file)
        self.model, self.config, self.tokenizer = pretrained.model, pretrained.config, pretrained.tokenizer
        self.model.train()
        self.checkpoint_path = Path(checkpoint)
        self.pooling, self.freeze_backbone = pooling, freeze_backbone
        if freeze_backbone:
            self.model.requires_grad_(False)
        self.dropout = nn.Dropout(head_dropout)
        self.head = nn.Linear(self.config.n_embd, self.task.num_labels)
        nn.init.normal_(self.head.weight, std=self.config.init_std)
        nn.init.zeros_(self.head.bias)
        self.metrics = nn.ModuleList(build_metrics(self.task) for _ in self.task.eval_splits)
        # Summed over all ranks by torchmetrics, like the metrics themselves.
        self.val_loss_sum = nn.ModuleList(SumMetric() for _ in self.task.eval_splits)
        self.val_count = nn.ModuleList(SumMetric() for _ in self.task.eval_splits)
        self.final_metrics: dict[str, float] = {}

    def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Right-padded ids (B, T) and lengths (B,) -> head outputs (B, num_labels)."""
        hidden = self.model.hidden_states(input_ids)  # (B, T, C)
        return self.head(self.dropout(pool(hidden, lengths, self.pooling)))  # (B, num_labels)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        if self.task.is_regression:
            return F.mse_loss(logits[:, 0].float(), labels.float(), reduction=reduction)
        return F.cross_entropy(logits.float(), labels, reduction=reduction)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.loss(self(batch["input_ids"], batch["lengths"]), batch["labels"])
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["labels"].numel())
        return loss

    def _split_prefix(self, split_idx: int) -> str:
        splits = self.task.eval_splits
        return "" if len(splits) == 1 else f"{splits[split_idx]}/"

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        logits = self(batch["input_ids"], batch["lengths"])  # (B, num_labels)
        self.metrics[dataloader_idx].update(predictions(self.task, logits), batch["labels"])
        self.val_loss_sum[dataloader_idx].update(self.loss(logits, batch["labels"], reduction="sum"))
        self.val_count[dataloader_idx].update(torch.tensor(float(batch["labels"].numel()), device=logits.device))

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        self.validation_step(batch, batch_idx, dataloader_idx)

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")

    def _log_epoch(self, stage: str) -> None:
        values: dict[str, float] = {}
        for i, collection in enumerate(self.metrics):
            if not self.val_count[i].update_called:
                continue
            prefix = self._split_prefix(i)
            computed = collection.compute()
            for name in self.task.metrics:  # the task's reporting order (F1 before accuracy for MRPC/QQP)
                values[f"{prefix}{name}"] = float(computed[name])
            loss = self.val_loss_sum[i].compute() / self.val_count[i].compute()
            self.log(f"{stage}/{prefix}loss", loss, add_dataloader_idx=False)
            collection.reset()
            self.val_loss_sum[i].reset()
            self.val_count[i].reset()
        if not values:
            return
        for name, value in values.items():
            self.log(f"{stage}/{name}", value, add_dataloader_idx=False, prog_bar=name.endswith(self.task.metrics[0]))
        score = task_score(values)
        self.log(f"{stage}/score", score, add_dataloader_idx=False)
        self.final_metrics = {**values, "score": score}

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        optimizer = torch.optim.AdamW(weight_decay_groups(self, hp.weight_decay), lr=hp.lr, betas=(0.9, 0.98))
        max_steps = int(self.trainer.estimated_stepping_batches)  # max_steps, or max_epochs x batches per epoch
        if max_steps <= 0 or max_steps >= 2**62:
            raise ValueError("GLUE fine-tuning needs trainer.max_steps or trainer.max_epochs (the schedule's length).")

        def schedule(step: int) -> float:
            return warmup_cosine(step, hp.warmup_steps, max_steps, hp.min_lr_ratio)

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_fit_start(self) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is not None and hasattr(datamodule, "summary") and self.trainer.is_global_zero:
            print(datamodule.summary())
