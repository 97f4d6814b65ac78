"""The attention contract as code: the checks every backend keeps, for the test suite and `check-backend` alike.

`cases.py` builds the tiny fp64 model a check runs on (a `Case`: backend name or `module:Class` path, options,
config overrides); `checks.py` holds the checks (plain functions: they return what they measured, raise
`AssertionError` naming what broke, or `NotApplicable` saying why the check cannot apply to this backend);
`check_backend.py` runs them all on one backend as `lightning_cqk check-backend NAME_OR_PATH [--options JSON]` and
prints the table. The test suite's harness (`tests/contract/test_contract.py`, `tests/backend_cases.py`) calls these
same functions over every built-in case: one implementation. What each backend is, as the reader sees it, lives here
too: `backends_table.py` generates docs/backends.md's table and answers `lightning_cqk attention` (names, papers,
options, size against `standard`).
"""
