"""Two validation sets: a small fixed subset for the intermediate validations, a larger fixed set for the final one.

With `data.final_val_windows: N` (`TokenDataModule`), the validation at the run's last step (`is_final_validation`:
`trainer.global_step >= trainer.max_steps`) scores the first N windows of the val split, and every other validation
(sanity check included) scores the windows `trainer.limit_val_batches` selects, as without the option
(`data/val_split.py`: the first limit x val_batch_size windows). Both sets are fixed prefixes of the split, split
across the ranks the same way, and logged under the same names (val/loss, val/ppl, val/bpb; `val/windows` says how
many windows a validation scored), so the final metric of a run is the final set's and its curves are the subset's.
`callbacks/val_windows.py` records the final set's windows (val_windows.json), which the report's sampling error and a
tuning grid's held-out loss read.

Why: the intermediate points only draw curves, and the final point is the one every verdict reads. A study run
validated 11 times on 256 windows; scoring the curves on 64 and the final point on 1,024 makes the verdicts' set 4x
larger (its sampling error halves) for about the same validation time (docs/studies-and-reports.md, "Run costs").

`ValidationSets` is the iterable Lightning gets as the val dataloader: each time a validation starts it iterates the
final set's or the subset's DataLoader, chosen then (in the main process, before any DataLoader worker starts). Its
length is the larger of the two in batches and Lightning's own batch limit is lifted (`trainer.limit_val_batches` =
1.0, the DataModule having consumed the limit), so Lightning never cuts the final set; a subset pass simply ends
early. Default (`final_val_windows: null`): one set for every validation, today's behaviour, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def is_final_validation(trainer: Any) -> bool:
    """Whether the validation now running is the run's final one: after its last step (`trainer.max_steps`), not the
    sanity check. A run without a step limit (a wall-clock budget alone) has no final validation known in advance."""
    if trainer is None or trainer.sanity_checking:
        return False
    return trainer.max_steps is not None and trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps


class ValidationSets:
    """The val dataloader of a run with a final set: iterates `final` at the final validation, else `subset`.

    Args:
        subset: the DataLoader of this rank's share of the intermediate windows.
        final: the DataLoader of this rank's share of the final windows.
        is_final: called as each validation starts: True at the run's final validation.
    """

    def __init__(self, subset: Any, final: Any, is_final: Callable[[], bool]) -> None:
        self.subset, self.final, self.is_final = subset, final, is_final

    def __len__(self) -> int:
        return max(len(self.subset), len(self.final))

    def __iter__(self) -> Iterator[Any]:
        return iter(self.final if self.is_final() else self.subset)
