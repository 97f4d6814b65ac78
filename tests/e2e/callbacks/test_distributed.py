"""Two CPU processes (gloo): sharded gradient norms sum squares across ranks; under DDP the norms are global and a
spike on one rank skips the update on every rank, so the replicas stay identical. Slow (process start-up)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tiny_run import tiny_trainer
from torch.utils.data import DataLoader

from lightning_cqk.callbacks import GradNormMonitor, LossSpikeMonitor
from lightning_cqk.callbacks.grad_norm_computer import GradNormComputer
from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM
from lightning_cqk.optim import OptimConfig

pytestmark = pytest.mark.slow
SPIKE_STEP = 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config() -> ModelConfig:
    return ModelConfig(vocab_size=64, n_layer=2, n_embd=32, n_head=4, block_size=16)


def _sharded_worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = GPT(_config())
    model(torch.randint(0, 64, (2, 16))).square().mean().backward()
    full = GradNormComputer(model).norms()
    params = list(model.parameters())
    for i, p in enumerate(params):  # each rank keeps every other gradient: a stand-in for a shard
        if i % 2 != rank:
            p.grad = None
    sharded = GradNormComputer(model).norms(sharded=True)
    local = GradNormComputer(model).norms(sharded=False)
    Path(out, f"rank{rank}.json").write_text(
        json.dumps({k: [full[k].item(), sharded[k].item(), local[k].item()] for k in full})
    )
    dist.destroy_process_group()


def test_sharded_norms_sum_squares_across_ranks(tmp_path: Path):
    mp.spawn(_sharded_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        values = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for key, (full, sharded, _local) in values.items():
            assert sharded == pytest.approx(full, rel=1e-5), key
        assert values["total"][2] < values["total"][0], "a shard alone is not the global norm"


class SpikeOnRankZero(LitLM):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        spike = self.trainer.global_step == SPIKE_STEP and self.global_rank == 0
        return loss * 10.0 if spike else loss


class Report(L.Callback):
    """Per rank: the local gradient norm the monitor should see, and a checksum of the weights at the end."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.norms: dict[int, float] = {}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        grads = [p.grad.flatten() for p in pl_module.parameters() if p.grad is not None]
        self.norms[trainer.global_step] = torch.cat(grads).norm().item() if grads else 0.0

    def on_train_end(self, trainer, pl_module) -> None:
        monitor = next(c for c in trainer.callbacks if isinstance(c, GradNormMonitor))
        spikes = next(c for c in trainer.callbacks if isinstance(c, LossSpikeMonitor))
        report = {
            "norms": self.norms,
            "monitor_total": monitor.latest.get("train/grad_norm/total"),
            "last_step": trainer.global_step - 1,
            "spikes": [s["step"] for s in spikes.spikes],
            "skipped": [s["step"] for s in spikes.skipped],
            "checksum": sum(p.double().sum().item() for p in pl_module.parameters()),
        }
        Path(self.out, f"ddp_rank{trainer.global_rank}.json").write_text(json.dumps(report))


def test_ddp_norms_are_global_and_spike_skips_on_every_rank(tmp_path: Path):
    L.seed_everything(0, verbose=False)
    module = SpikeOnRankZero(_config(), OptimConfig(lr=1e-2, warmup_steps=2))
    data = DataLoader(torch.randint(0, 64, (64, 17)), batch_size=4)
    trainer = tiny_trainer(
        strategy="ddp_spawn",
        devices=2,
        max_steps=8,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        callbacks=[
            GradNormMonitor(every_n_steps=1),
            LossSpikeMonitor(warmup_steps=3, action="skip"),
            Report(str(tmp_path)),
        ],
    )
    trainer.fit(module, data)
    reports = [json.loads((tmp_path / f"ddp_rank{r}.json").read_text()) for r in (0, 1)]
    for report in reports:
        assert report["spikes"] == [SPIKE_STEP] and report["skipped"] == [SPIKE_STEP]
        last = str(report["last_step"])
        assert report["monitor_total"] == pytest.approx(report["norms"][last], rel=1e-5)
    assert reports[0]["norms"] == pytest.approx(reports[1]["norms"], rel=1e-6), "averaged gradients: same norm"
    assert reports[0]["checksum"] == reports[1]["checksum"], "the replicas stayed identical"
