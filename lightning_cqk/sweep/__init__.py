"""Sweeps: expand an ablation spec (configs/ablations/*.yaml) into runs, run them resumably, and report on them.

spec.py     the spec format, profiles and grid expansion into deterministically named runs
runner.py   local (sequential or N at a time) and SLURM launching, manifest, skip and resume
report.py   Markdown / CSV tables and PNG figures from the runs' TensorBoard scalars
stats.py    mean / std over seeds, Welch's t-test (Student-t CDF without scipy)
"""

from lightning_cqk.sweep.spec import Run, SpecError, Sweep, expand, load_spec

__all__ = ["Run", "SpecError", "Sweep", "expand", "load_spec"]
