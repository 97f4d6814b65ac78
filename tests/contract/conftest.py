"""The contract harness's fast-loop selection (`make test-fast`): `contract_smoke` marks, for each test parametrized by
a `case`, its first case of each backend (the first `Case` of a backend in `backend_cases.CASES` that the test runs);
for a test parametrized otherwise (one backend each: the compile graphs, rows / determinism / bf16), its first
parameter set; and every test not parametrized (coverage, the checks failing on broken backends). `make test` runs
every case."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seen: set[tuple[str, str]] = set()  # (test function, backend) pairs already given a smoke case
    for item in items:
        if HERE not in Path(item.path).resolve().parents:
            continue
        callspec = getattr(item, "callspec", None)
        case = callspec.params.get("case") if callspec is not None else None
        if callspec is not None:
            key = (item.originalname, case.backend if case is not None else "")
            if key in seen:
                continue
            seen.add(key)
        item.add_marker(pytest.mark.contract_smoke)
