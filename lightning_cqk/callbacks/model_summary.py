"""`ParameterSummary`: Lightning's model summary without its FLOPs column, which reads 0 for every module here.

Lightning counts FLOPs only by running `example_input_array` through the model, which `LitLM` does not set (a
forward at the summary would cost a full batch at start-up); every launch then printed a FLOPs column of zeros and
"0 Total Flops". The analytic training FLOPs are logged by `Throughput` and recorded in `budget.json`
(`lightning_cqk/model/flops.py`). `lightning_cqk fit` puts this in place of Lightning's default `ModelSummary`
(same `max_depth`); `trainer.enable_model_summary: false` still turns the summary off.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table
from lightning.pytorch.utilities.rank_zero import rank_zero_info


class ParameterSummary(ModelSummary):
    """The parameter table of `ModelSummary`, without the FLOPs column and total (module docstring)."""

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        columns = [column for column in summary_data if column[0] != "FLOPs"]
        table = _format_summary_table(
            total_parameters, trainable_parameters, model_size, total_training_modes, total_flops, *columns
        )
        lines = [line for line in table.splitlines() if not line.rstrip().endswith("Total Flops")]
        rank_zero_info("\n" + "\n".join(lines))


def without_flops_column(callbacks: list[Any]) -> None:
    """Replace Lightning's own `ModelSummary` (exactly that class) in `callbacks` by a `ParameterSummary`."""
    for i, callback in enumerate(callbacks):
        if type(callback) is ModelSummary:
            callbacks[i] = ParameterSummary(max_depth=callback._max_depth)
