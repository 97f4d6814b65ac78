"""The claims judged from the runs' numbers: statistics, verdicts, estimates (map: study/__init__.py)."""
