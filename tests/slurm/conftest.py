"""The SLURM tests' one cluster per test process (tests/slurm_cluster.py), started at the first test that asks for
it and stopped, with every process it started, at the session's end; skipped with how to install SLURM where the
binaries are absent. Every test here is in the xdist group "slurm" (`make test` runs `--dist loadgroup`), so one
test process runs them all against one cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from slurm_cluster import ClusterUnavailable, SlurmCluster, missing_reason

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    for item in items:
        if Path(str(item.fspath)).resolve().parent == HERE:
            item.add_marker(pytest.mark.xdist_group("slurm"))
            item.add_marker(pytest.mark.slow)  # jobs of several processes: `make test` runs them, test-fast not


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory) -> SlurmCluster:
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except ClusterUnavailable as err:
        pytest.fail(f"the private SLURM cluster did not start: {err}")
    yield cluster
    cluster.stop()
    assert not cluster.leftovers(), f"processes of the test cluster outlived it: {cluster.leftovers()}"
