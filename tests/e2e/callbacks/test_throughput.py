"""Throughput: keys after the warm-up only, no MFU on CPU without a peak, MFU with one, the peak table."""

from __future__ import annotations

import pytest
import torch

from lightning_cqk.callbacks import Throughput
from lightning_cqk.callbacks.throughput import peak_flops_for, precision_dtype
from lightning_cqk.model.flops import training_flops_per_batch

BATCH, SEQ = 4, 16  # the conftest loaders' shapes


def test_keys_after_warmup_and_no_mfu_on_cpu(make_module, make_trainer, tiny_config, token_loader):
    monitor = Throughput(warmup_steps=3, every_n_steps=2)
    trainer, logger = make_trainer([monitor], max_steps=10)
    trainer.fit(make_module(), token_loader())
    tokens = logger.series("train/tokens_per_sec")
    flops = logger.series("train/flops_per_sec")
    assert sorted(tokens) == sorted(flops) == [3, 5, 7, 9], "the first window opens after the 3 warm-up steps"
    assert all(v > 0 for v in tokens.values())
    per_token = training_flops_per_batch(tiny_config(), BATCH, SEQ) / (BATCH * SEQ)
    assert flops[9] / tokens[9] == pytest.approx(per_token, rel=1e-9)
    assert not logger.series("train/mfu"), "CPU without peak_flops: no MFU key"


def test_mfu_with_a_peak_override(make_module, make_trainer, token_loader):
    monitor = Throughput(warmup_steps=1, every_n_steps=2, peak_flops=1e9)
    trainer, logger = make_trainer([monitor], max_steps=6)
    trainer.fit(make_module(), token_loader())
    mfu, flops = logger.series("train/mfu"), logger.series("train/flops_per_sec")
    assert sorted(mfu) == [1, 3, 5]
    assert all(mfu[s] == pytest.approx(flops[s] / 1e9) for s in mfu)


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-40GB", 312e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA A10G", 125e12),
        ("NVIDIA GeForce RTX 4090", 165e12),
        ("Tesla V100-SXM2-16GB", 125e12),
        ("Tesla T4", 65e12),
        ("Some Future GPU", None),
    ],
)
def test_peak_table(name: str, peak: float | None):
    assert peak_flops_for(name) == peak


@pytest.mark.parametrize(
    "name, dtype, tf32, peak",
    [
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, True, 989e12),
        ("NVIDIA H100 80GB HBM3", torch.float16, True, 989e12),
        ("NVIDIA H100 80GB HBM3", torch.float32, True, 495e12),  # TF32 tensor cores
        ("NVIDIA H100 80GB HBM3", torch.float32, False, 67e12),  # CUDA cores
        ("NVIDIA A100-SXM4-80GB", torch.float32, True, 156e12),
        ("NVIDIA A100-SXM4-80GB", torch.float32, False, 19.5e12),
        ("Tesla V100-SXM2-16GB", torch.float32, True, 15.7e12),  # no TF32: the fp32 peak
        ("NVIDIA H100 80GB HBM3", torch.float64, True, None),
    ],
)
def test_peak_table_per_dtype(name, dtype, tf32, peak):
    assert peak_flops_for(name, dtype, tf32=tf32) == peak


def test_precision_flags_map_to_their_matmul_dtype():
    assert precision_dtype("bf16-mixed") == precision_dtype("bf16-true") == torch.bfloat16
    assert precision_dtype("16-mixed") == torch.float16
    assert precision_dtype("32-true") == torch.float32
    assert precision_dtype("64-true") is None
