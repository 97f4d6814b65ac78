"""A run before and around its steps. Everything a trainer command decides before anything is built is its
preflight (preflight.py: `preflight(inputs) -> RunPlan`, an ordered list of small checks; the strategy flag:
strategy_flag.py). What the checks use: the run's directory (directory.py: names, records, resumes, which run a
checkpoint belongs to), one live process per directory (lock.py), which process of a launch this is
(launch_rank.py), the memory check (memory_check.py), where callbacks may write (outputs.py). Around the steps: how a
stopped attempt ends (attempt.py), the SLURM job and its requeue (slurm_job.py), Lightning's SLURM auto-requeue
switched off (slurm_preemption.py), and what a run records about its code, packages and device
(version_records.py)."""
