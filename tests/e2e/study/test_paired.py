"""Paired design: runs of different levels with the same seed see the same training batches in the same order and
start from the same values for every parameter they have in common; another seed changes both."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

from lightning_cqk.cli.trainer import CQKCLI
from lightning_cqk.study.design.spec import expand

REPO = Path(__file__).resolve().parents[3]


def _instantiate(run, sweep_dir: Path, corpus: Path, shards: Path):
    """The run's own `lightning_cqk fit` arguments (shrunk data), instantiated in-process as the CLI does."""
    run = dataclasses.replace(run, overrides={**run.overrides, "model.optim.lr": 0.002})  # the grid's choice
    args = run.cli_args(sweep_dir) + [
        f"--data.source={corpus}",
        f"--data.data_dir={shards}",
        "--data.val_fraction=0.2",
        "--data.seq_len=32",
        "--data.batch_size=2",
        "--data.final_val_windows=2",  # the spec's final validation set, shrunk with the data
    ]
    cli = CQKCLI(args=args, run=False)
    dm = cli.datamodule
    dm.prepare_data()
    dm.setup("fit")
    batches = []
    for i, batch in enumerate(dm.train_dataloader()):
        batches.append(batch.clone())
        if i == 2:
            break
    return dict(cli.model.model.named_parameters()), batches


def test_levels_of_one_seed_share_batches_and_shared_initial_values(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # seed_everything writes it: undone after the test
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Doc {i}. " + f"word{i % 7} " * 60}) + "\n" for i in range(40)))
    sweep = expand(REPO / "configs" / "ablations" / "coupling.yaml", "cpu", output=tmp_path / "sweep")
    shards = tmp_path / "shards"
    runs = {name: sweep.run(name) for name in ("standard-s1", "coupled-leapfrog-s1", "uncoupled_mlp-s1", "standard-s2")}
    assert runs["standard-s1"].overrides["data.seed"] == 1 and runs["standard-s2"].overrides["data.seed"] == 2
    got = {name: _instantiate(run, sweep.sweep_dir, corpus, shards) for name, run in runs.items()}

    base_params, base_batches = got["standard-s1"]
    for other in ("coupled-leapfrog-s1", "uncoupled_mlp-s1"):
        params, batches = got[other]
        common = [k for k in base_params if k in params and params[k].shape == base_params[k].shape]
        # every standard parameter (embedding, norms, q/k/v/out projections, MLPs) exists in the coupled levels
        assert common == list(base_params), sorted(set(base_params) - set(common))
        assert {"wte.weight", "blocks.0.attn.q_proj.weight", "blocks.3.mlp.up_proj.weight"} <= set(common)
        for k in common:
            assert torch.equal(params[k], base_params[k]), k
        assert set(params) - set(base_params), "the level adds parameters of its own"
        assert all(torch.equal(a, b) for a, b in zip(batches, base_batches, strict=True))
    params2, batches2 = got["standard-s2"]
    assert not torch.equal(params2["wte.weight"], base_params["wte.weight"])  # another seed: other values
    assert any(not torch.equal(a, b) for a, b in zip(batches2, base_batches, strict=True))  # and another order
