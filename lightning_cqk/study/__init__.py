"""Studies: expand an ablation spec (configs/ablations/*.yaml) into runs, run them resumably, judge the claims and
report on them. Four stages, one sub-package each; imports follow the stages (tests/test_import_graph.py): design <
judge < report, and run/ imports only design/ and the results model (results_model.py, and the committed results
files read through report/results.py, which adoption reads its twins from).

results_model.py   what a report reads about one study (StudyData, its Group and TuningTable), passed from stage to
                   stage; ReportError
design/            what a study is, before anything runs
  spec.py          the spec format, profiles and grid expansion into deterministically named runs
  spec_checks.py   what keeps a spec from silently changing the experiment (duplicate keys, names, seeds, claims)
  plan.py          what an expanded spec is: a Run (CLI args, config hash) and a Sweep (runs, claims parsed once)
  claim.py         a claim, parsed once into a typed object (the spec check, the power plan and the verdict share it)
  control.py       the planted control: its check, its runs, and the claim that tests it
  rate_grid.py     a profile's learning-rate grid as runs, and the tuned runs set to wait for it
  tuned_rate.py    each mechanism's own learning rate: the `{tuned_lr:...}` reference and the grid's choice rule
  settings.py      a run's settings as the CLI's own parser resolves them, asked of one resolver process
  units.py         a paper's change of perplexity in the study's unit (bytes); `lightning_cqk units-table`
  cost_estimate.py the CPU time of a sweep from analytic FLOPs and a measured step time (`--dry-run`); when runs
                   last validate
  cost_calibration.py  the estimate's constants fitted to the committed studies' measured run times
  start_mode.py    how runs start: forked from the pre-imported worker, or fresh (`--start`)
  new_study.py     `lightning_cqk new-study`: a spec of your backend against standard, ready to dry-run
run/               running the runs, resumably, and remembering what computed them
  runner.py        local (sequential or N at a time) launching, skip and resume, the `lightning_cqk sweep` command's
                   runs (the command then reports: report/after_sweep.py)
  ledger.py        a sweep's bookkeeping: status files, manifest.json, code revisions and package versions per run
  identity.py      what a run *is*: the same code, data and settings computed it (one sha256, recorded, checked)
  sharing.py       no run computed twice, at launch: the same run of this sweep, a sibling's, or an adopted twin
  adopt.py         runs whose committed twin exists are adopted, not computed again
  tuned_overrides.py  a tuned run's rate filled in at launch from its grid runs' held-out losses
  run_scalars.py   a run's logged scalars read from its TensorBoard event files
  shard_settings.py  which runs may prepare token shards at the same time
  slurm_submit.py  SLURM array scripts (one task per run), the report job, submit.sh
  slurm_status.py  `sweep --status`: each run's state, step and SLURM job state (squeue, no accounting needed)
  worker.py        a fork server that pays a run's imports once per sweep
judge/             the claims judged from the runs' numbers
  stats.py         scipy.stats: paired / Welch t, Holm, minimum detectable effect, variance ratios, bootstrap
  verdict.py       the claims judged (replicated ... inconclusive), gated by a planted control; interim until all ran
  group_estimates.py  estimating: group tables, sampling errors, the grid's choice, the control's predicted size,
                   verdicts
  power_plan.py    the power plan a dry run prints after its estimate
report/            what a reader sees (report_command.py runs reading, estimating and rendering in order)
  report_read.py   reading: the manifest or committed results, each finished run's scalars, windows and rate
  render.py        rendering: the Markdown and CSV of the report, and the cells the claims table shares
  report_command.py  the `lightning_cqk report` command: reads, estimates, renders and writes (finished runs only)
  report_folder.py the report written beside its folder and swapped in whole
  results.py       the committed result files, and the report's input read back from them
  second_sources.py  each committed runs.csv number a verdict, grid or control reads, recomputed from its source
  figures.py       the report's PNG figures
  claims_table.py  the table of every claim and verdict in docs/results/README.md (`lightning_cqk claims-table`)
  after_sweep.py   what `lightning_cqk sweep` does after its runs: the power plan (dry run) or the report, the exit
"""

from lightning_cqk.study.design.spec import Run, SpecError, Sweep, expand, load_spec

__all__ = ["Run", "SpecError", "Sweep", "expand", "load_spec"]
