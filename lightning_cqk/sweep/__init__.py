"""Sweeps: expand an ablation spec (configs/ablations/*.yaml) into runs, run them resumably, and report on them.

Design
  spec.py          the spec format, profiles and grid expansion into deterministically named runs
  plan.py          what an expanded spec is: a Run (CLI args, config hash) and a Sweep (runs, claims parsed once)
  control.py       the planted control: its check, its runs, and the claim that tests it
  tuning_grid.py   a profile's learning-rate grid as runs, and the tuned runs set to wait for it
  spec_checks.py   what keeps a spec from silently changing the experiment (duplicate keys, names, seeds, claims)
  claim.py         a claim, parsed once into a typed object (the spec check, the power plan and the verdict share it)
  identity.py      what a run *is*: the same code, data and settings computed it (one sha256, recorded, checked)
  settings.py      a run's settings as the CLI's own parser resolves them, asked of one resolver process
  tuning.py        each mechanism's own learning rate, from a grid the verdicts never read
  units.py         a paper's change of perplexity in the study's unit (bytes)
  estimate.py      the CPU time of a sweep from analytic FLOPs and a measured step time (`--dry-run`); when runs
                   last validate
  new_study.py     `lightning_cqk new-study`: a spec of your backend against standard, ready to dry-run
Run
  runner.py        local (sequential or N at a time) launching, skip and resume, the `lightning_cqk sweep` command
  ledger.py        a sweep's bookkeeping: status files, manifest.json, code revisions and package versions per run
  sharing.py       no run computed twice, at launch: the same run of this sweep, a sibling's, or an adopted twin
  shard_settings.py  which runs may prepare token shards at the same time
  slurm.py         SLURM array scripts (one task per run), the report job, submit.sh
  slurm_status.py  `sweep --status`: each run's state, step and SLURM job state (squeue, no accounting needed)
  worker.py        a fork server that pays a run's imports once per sweep
  adopt.py         runs whose committed twin exists are adopted, not computed again
Judge
  stats.py         scipy.stats: paired / Welch t, Holm, minimum detectable effect, variance ratios, bootstrap
  verdict.py       the claims judged (replicated ... inconclusive), gated by a planted control; interim until all ran
Write (report.py runs the three stages in order)
  report_read.py   reading: the manifest or committed results, each finished run's scalars, windows and rate
  estimators.py    estimating: group tables, sampling errors, the grid's choice, the control's predicted size, verdicts
  render.py        rendering: the Markdown and CSV of the report, and the cells the claims table shares
  study_data.py    what the report reads about one study (StudyData), passed from stage to stage
  report.py        the `lightning_cqk report` command: reads, estimates, renders and writes (finished runs only)
  report_folder.py the report written beside its folder and swapped in whole
  results.py       the committed result files, and the report's input read back from them
  second_sources.py  each committed runs.csv number a verdict, grid or control reads, recomputed from its source
  figures.py       the report's PNG figures
  claims_table.py  the table of every claim and verdict in docs/results/README.md
"""

from lightning_cqk.sweep.spec import Run, SpecError, Sweep, expand, load_spec

__all__ = ["Run", "SpecError", "Sweep", "expand", "load_spec"]
