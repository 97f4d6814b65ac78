"""What a study is, before anything runs: spec, claims, plan, tuning grid, cost estimate (map: study/__init__.py)."""
