"""The SLURM tests' cluster (tests/slurm_cluster.py), started at the first test that asks for it and stopped, with
every process it started, at the session's end (checked: none outlives it); skipped with how to install SLURM where
the binaries are absent. The tests that use it are one test item (test_slurm_study.py), so under `make test`'s
2 processes one cluster runs."""

from __future__ import annotations

import pytest
from slurm_cluster import ClusterUnavailable, SlurmCluster, missing_reason


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
