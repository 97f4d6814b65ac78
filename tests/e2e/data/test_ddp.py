"""DDP with 2 CPU processes (gloo): the ranks read disjoint windows that together cover the training split once
per epoch, a new order each epoch, and the run ends (validation included) without hanging at epoch boundaries."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from litdata import StreamingDataset, TokensLoader
from tiny_run import REPO

from lightning_cqk.data import prepare


@pytest.fixture(scope="module")
def random_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shards of random letters, so every 17-token window is distinct and windows identify positions."""
    rng = random.Random(0)
    root = tmp_path_factory.mktemp("ddp")
    with (root / "docs.jsonl").open("w") as f:
        for _ in range(120):
            f.write(json.dumps({"text": "".join(rng.choices("abcdefghijklmnopqrstuvwxyz ", k=150))}) + "\n")
    prepare(str(root / "docs.jsonl"), str(root / "shards"), val_fraction=0.2)
    return root / "shards"


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 1])
def test_two_process_ddp_reads_disjoint_windows_covering_each_epoch(
    random_shards: Path, tmp_path: Path, num_workers: int
):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(Path(__file__).with_name("ddp_worker.py")), str(random_shards), str(tmp_path)]
    done = subprocess.run([*cmd, str(num_workers)], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]

    every = [
        tuple(int(t) for t in w)
        for w in StreamingDataset(str(random_shards / "train"), item_loader=TokensLoader(block_size=17), shuffle=False)
    ]
    assert len(set(every)) == len(every), "random text: windows are distinct"
    orders = []
    for epoch in range(2):
        ranks = [json.loads((tmp_path / f"rank{r}-epoch{epoch}.json").read_text()) for r in range(2)]
        assert all(r["world_size"] == 2 for r in ranks)
        a, b = ([tuple(w) for w in r["windows"]] for r in ranks)
        assert len(a) == len(b) > 0, "equal batch counts per rank (drop_last), so no rank waits on the other"
        assert not set(a) & set(b), "ranks read disjoint windows"
        seen = a + b
        assert len(set(seen)) == len(seen) and set(seen) <= set(every)
        assert len(every) - len(seen) < 2 * 2 * 4, "together they cover the split (less than one global batch)"
        orders.append(seen)
    assert orders[0] != orders[1], "each epoch reshuffles"
