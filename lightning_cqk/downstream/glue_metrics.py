"""The official GLUE metric of each task, as torchmetrics, and the task score.

    mcc       Matthews correlation (CoLA)                    GlueMatthewsCorrCoef (torchmetrics', 0 when undefined)
    acc       accuracy (SST-2, MNLI, QNLI, RTE, WNLI; MRPC, QQP)  Accuracy(task="multiclass")
    f1        F1 of the positive class (MRPC, QQP)           F1Score(task="binary")
    pearson   Pearson correlation (STS-B)                    PearsonCorrCoef
    spearman  Spearman rank correlation (STS-B)              SpearmanCorrCoef

Values are fractions (accuracy in [0, 1], correlations in [-1, 1]); tables show them x 100, as GLUE does. A task's
score is the mean of its metrics over its evaluation splits (MNLI: matched and mismatched accuracy), which is how the
GLUE leaderboard averages tasks with several numbers.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import Accuracy, BinaryF1Score, BinaryMatthewsCorrCoef
from torchmetrics.regression import PearsonCorrCoef, SpearmanCorrCoef

from lightning_cqk.downstream.glue_tasks import GlueTask


class GlueMatthewsCorrCoef(BinaryMatthewsCorrCoef):
    """Binary MCC that is 0 when it is undefined (a constant prediction or a single-class target), as GLUE's scorer
    (scikit-learn's ``matthews_corrcoef``) reports it.

    torchmetrics (1.9) instead replaces the zero denominator by an epsilon formula and returns a small positive
    number: a classifier that answers "acceptable" to every CoLA dev sentence would score MCC 0.026 instead of 0.
    """

    def compute(self) -> torch.Tensor:
        confmat = self.confmat  # (2, 2): rows targets, columns predictions
        if (confmat.sum(dim=0) == 0).any() or (confmat.sum(dim=1) == 0).any():
            return torch.zeros((), dtype=torch.float32, device=confmat.device)
        return super().compute()


def build_metric(name: str, num_labels: int) -> Metric:
    """One metric by name (see the module docstring)."""
    if name == "mcc":
        return GlueMatthewsCorrCoef()
    if name == "acc":
        return Accuracy(task="multiclass", num_classes=num_labels)
    if name == "f1":
        return BinaryF1Score()
    if name == "pearson":
        return PearsonCorrCoef()
    if name == "spearman":
        return SpearmanCorrCoef()
    raise ValueError(f"Unknown GLUE metric {name!r}; known: mcc, acc, f1, pearson, spearman.")


def build_metrics(task: GlueTask) -> MetricCollection:
    """A collection of the task's metrics; update it with (predictions, targets) as `predictions` returns them."""
    return MetricCollection({name: build_metric(name, task.num_labels) for name in task.metrics})


def predictions(task: GlueTask, logits: torch.Tensor) -> torch.Tensor:
    """Head outputs (B, num_labels) -> class ids (B,) int64, or scores (B,) fp32 for regression."""
    return logits[:, 0].float() if task.is_regression else logits.argmax(dim=-1)  # (B,)


def task_score(values: dict[str, float]) -> float:
    """The mean of a task's metric values (all splits, all metrics)."""
    if not values:
        raise ValueError("a task score needs at least one metric value")
    return sum(values.values()) / len(values)
