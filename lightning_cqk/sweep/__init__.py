"""Sweeps: expand an ablation spec (configs/ablations/*.yaml) into runs, run them resumably, and report on them.

spec.py     the spec format, profiles and grid expansion into deterministically named runs
spec_checks.py  what keeps a spec from silently changing the experiment (duplicate keys, names, seeds, claims)
runner.py   local (sequential or N at a time) and SLURM launching, manifest, skip and resume
report.py   verdicts, Markdown / CSV tables from the runs' TensorBoard scalars (finished runs only)
figures.py  the report's PNG figures
stats.py    scipy.stats: paired / Welch t, Holm, minimum detectable effect, variance ratios, bootstrap
verdict.py  the claims judged (replicated ... inconclusive), gated by a planted control; interim until all seeds ran
estimate.py the CPU time of a sweep from analytic FLOPs and a measured step time (`--dry-run`)
"""

from lightning_cqk.sweep.spec import Run, SpecError, Sweep, expand, load_spec

__all__ = ["Run", "SpecError", "Sweep", "expand", "load_spec"]
