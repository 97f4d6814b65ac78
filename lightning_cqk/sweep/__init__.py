"""Sweeps: expand an ablation spec (configs/ablations/*.yaml) into runs, run them resumably, and report on them.

Design
  spec.py          the spec format, profiles and grid expansion into deterministically named runs
  spec_checks.py   what keeps a spec from silently changing the experiment (duplicate keys, names, seeds, claims)
  identity.py      what a run *is*, whatever its level is called: no run computed twice
  tuning.py        each mechanism's own learning rate, from a grid the verdicts never read
  units.py         a paper's change of perplexity in the study's unit (bytes)
  estimate.py      the CPU time of a sweep from analytic FLOPs and a measured step time (`--dry-run`)
Run
  runner.py        local (sequential or N at a time) and SLURM launching, manifest, skip and resume
  worker.py        a fork server that pays a run's imports once per sweep
  adopt.py         runs whose committed twin exists are adopted, not computed again
Judge
  stats.py         scipy.stats: paired / Welch t, Holm, minimum detectable effect, variance ratios, bootstrap
  verdict.py       the claims judged (replicated ... inconclusive), gated by a planted control; interim until all ran
Write
  report.py        verdicts, Markdown / CSV tables from the runs' TensorBoard scalars (finished runs only)
  report_folder.py the report written beside its folder and swapped in whole
  results.py       the committed result files, and the report's input read back from them
  figures.py       the report's PNG figures
  claims_table.py  the table of every claim and verdict in docs/results/README.md
"""

from lightning_cqk.sweep.spec import Run, SpecError, Sweep, expand, load_spec

__all__ = ["Run", "SpecError", "Sweep", "expand", "load_spec"]
