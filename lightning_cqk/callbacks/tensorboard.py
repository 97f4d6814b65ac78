"""The TensorBoard logger of `lightning_cqk fit`: the curves a user looks for first, and no `epoch` chart.

Lightning's `TensorBoardLogger` with two changes (`fit` uses it in place of Lightning's, the same settings):

* `epoch` is not logged. Lightning adds it to every logged dict; streaming data has no epochs worth a chart, and
  its flat line sat among the first cards.
* A custom-scalars layout (TensorBoard's "Custom Scalars" tab, `http://localhost:6006/#custom_scalars`) puts first
  what a run is read by: the loss (train/loss beside val/loss, whose scale stays readable when a GPT-2 run's
  perplexity is in the thousands), val/ppl, the gradient norms (`GradNormMonitor`, `train/grad_norm/*`) and the
  learning rate; the instruments (throughput, spikes, attention statistics) follow. Only the charts that a callback
  of the run logs are in it (`layout_for`: the quickstart has no gradient-norm or throughput chart). TensorBoard
  reads a run's first layout only, so it is written once, with the first metrics. The default "Scalars" / "Time
  Series" tabs keep every tag, grouped by prefix as always (alphabetically: `lr-*` and `params/*` before `train/`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger as LightningTensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

#: The custom-scalars layout: {category: {chart: ["Multiline" | "Margin", [tags or regexes]]}}, first category first.
LAYOUT: dict[str, dict[str, list[Any]]] = {
    "1 read first": {
        "loss (train/loss, val/loss)": ["Multiline", [r"train/loss$", r"val/loss$"]],
        "val/ppl": ["Multiline", [r"val/ppl$"]],
        "gradient norms": ["Multiline", [r"train/grad_norm/.*"]],
        "learning rate": ["Multiline", [r"lr-.*"]],
    },
    "2 instruments": {
        "throughput": ["Multiline", [r"train/(tokens|flops)_per_sec$", r"train/mfu$"]],
        "spikes and skipped updates": ["Multiline", [r"train/(spikes|skipped_updates|nonfinite_steps)$"]],
        "attention max logit": ["Multiline", [r"attn/max_logit/.*"]],
        "attention entropy": ["Multiline", [r"attn/entropy/.*"]],
    },
}
NOT_LOGGED = frozenset({"epoch"})

#: The callbacks (by class name) that log a chart's tags; a chart none of them is in the trainer for stays out of the
#: layout (an empty chart reads like a broken instrument). Charts not listed are logged by the LightningModule.
LOGGED_BY: dict[str, tuple[str, ...]] = {
    "gradient norms": ("GradNormMonitor",),
    "learning rate": ("LearningRateMonitor",),
    "throughput": ("Throughput",),
    "spikes and skipped updates": ("LossSpikeMonitor", "NonFiniteGuard"),
    "attention max logit": ("AttentionStats",),
    "attention entropy": ("AttentionStats",),
}


def layout_for(callbacks: list[Any]) -> dict[str, dict[str, list[Any]]]:
    """`LAYOUT` without the charts that no callback in `callbacks` logs (and without categories left empty)."""
    present = {cls.__name__ for callback in callbacks for cls in type(callback).__mro__}
    kept = {
        category: {
            chart: spec for chart, spec in charts.items() if chart not in LOGGED_BY or present & set(LOGGED_BY[chart])
        }
        for category, charts in LAYOUT.items()
    }
    return {category: charts for category, charts in kept.items() if charts}


class TensorBoardLogger(LightningTensorBoardLogger):
    """Lightning's TensorBoard logger without the `epoch` chart and with the layout above (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._layout_written = False
        self.layout = LAYOUT  # `lightning_cqk fit` narrows it to the charts its callbacks log (`layout_for`)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        metrics = {k: v for k, v in metrics.items() if k not in NOT_LOGGED}
        if not metrics:
            return
        if not self._layout_written:
            self.experiment.add_custom_scalars(to_summary_layout(self.layout))
            self._layout_written = True
        super().log_metrics(metrics, step)


def to_summary_layout(layout: dict[str, dict[str, list[Any]]]) -> dict[str, dict[str, list[Any]]]:
    """`LAYOUT` in the form `SummaryWriter.add_custom_scalars` takes (regexes joined per chart)."""
    return {
        category: {chart: [kind, ["|".join(f"({tag})" for tag in tags)]] for chart, (kind, tags) in charts.items()}
        for category, charts in layout.items()
    }
