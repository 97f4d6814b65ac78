"""The official metrics equal hand computations on a fixed tiny prediction set."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_cqk.downstream.glue_metrics import build_metrics, predictions, task_score
from lightning_cqk.downstream.glue_tasks import get_task

# preds vs labels: TP = 3 (idx 0, 1, 2), FN = 1 (idx 3), FP = 2 (idx 4, 5), TN = 4 (idx 6..9)
PREDS = torch.tensor([1, 1, 1, 0, 1, 1, 0, 0, 0, 0])
LABELS = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0, 0, 0])
TP, FN, FP, TN = 3, 1, 2, 4


def _compute(task_name: str, preds: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    metrics = build_metrics(get_task(task_name))
    metrics.update(preds, labels)
    return {k: float(v) for k, v in metrics.compute().items()}


def test_cola_matthews_correlation_by_hand():
    mcc = (TP * TN - FP * FN) / math.sqrt((TP + FP) * (TP + FN) * (TN + FP) * (TN + FN))  # 10 / sqrt(600)
    assert _compute("cola", PREDS, LABELS) == pytest.approx({"mcc": mcc})
    assert mcc == pytest.approx(0.408248, abs=1e-6)


def test_mrpc_and_qqp_f1_and_accuracy_by_hand():
    f1 = 2 * TP / (2 * TP + FP + FN)  # 6 / 9
    acc = (TP + TN) / 10
    for task in ("mrpc", "qqp"):
        assert _compute(task, PREDS, LABELS) == pytest.approx({"f1": f1, "acc": acc})


def test_mnli_three_class_accuracy_by_hand():
    logits = torch.tensor([[3.0, 0, 0], [0, 2, 0], [0, 0, 1], [1, 0, 0], [0, 5, 0]])
    labels = torch.tensor([0, 1, 1, 2, 1])
    assert _compute("mnli", predictions(get_task("mnli"), logits), labels) == pytest.approx({"acc": 3 / 5})


def test_stsb_pearson_and_spearman_by_hand():
    preds = torch.tensor([1.0, 2.0, 3.0, 4.0, 10.0])
    labels = torch.tensor([2.0, 1.0, 4.0, 3.0, 5.0])
    # Pearson by the formula; Spearman = Pearson of the ranks [1..5] vs [2, 1, 4, 3, 5] = 1 - 6*4/(5*24) = 0.8
    mp, ml = preds.mean(), labels.mean()
    pearson = float(((preds - mp) * (labels - ml)).sum() / ((preds - mp).norm() * (labels - ml).norm()))
    out = _compute("stsb", predictions(get_task("stsb"), preds[:, None]), labels)
    assert out == pytest.approx({"pearson": pearson, "spearman": 0.8}, abs=1e-6)


def test_task_score_is_the_mean_of_the_metrics():
    assert task_score({"f1": 0.8, "acc": 0.7}) == pytest.approx(0.75)
    assert task_score({"matched/acc": 0.5, "mismatched/acc": 0.7}) == pytest.approx(0.6)
    with pytest.raises(ValueError):
        task_score({})


def test_mcc_of_a_constant_prediction_is_zero_as_glue_reports_it():
    labels = torch.tensor([1] * 721 + [0] * 322)  # CoLA dev's label counts
    for constant in (0, 1):
        assert _compute("cola", torch.full_like(labels, constant), labels) == {"mcc": 0.0}
    # torchmetrics' own binary MCC gives 0.026 here (its epsilon fallback), which GLUE would not
    from torchmetrics.classification import BinaryMatthewsCorrCoef

    assert float(BinaryMatthewsCorrCoef()(torch.ones_like(labels), labels)) > 0.02
    assert _compute("cola", labels, labels) == pytest.approx({"mcc": 1.0})
