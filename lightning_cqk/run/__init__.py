"""A run before and around its steps: its directory (directory.py: names, records, resumes, which run a checkpoint
belongs to), one live process per directory (lock.py), which process of a launch this is (launch_rank.py), the
memory check (memory_check.py), where callbacks may write (outputs.py), the SLURM job (slurm_job.py) and what a run
records about its code, packages and device (version_records.py)."""
