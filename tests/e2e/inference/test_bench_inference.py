"""The bench's inference measurements (benchmarks/bench_inference.py): the measured cache equals the analytic count,
Q-K=V measures half of standard and Q-MQA 1 / (2 n_head), and the decode peak holds the cache."""

from __future__ import annotations

from pathlib import Path

import torch

from lightning_cqk.model_config import ModelConfig

REPO = Path(__file__).resolve().parents[3]


def test_measured_cache_and_decode_memory(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from bench_inference import measure_inference

    variants = {
        "standard": {},
        "k_eq_v": {"qkv_sharing": "k_eq_v"},
        "q_mqa": {"qkv_sharing": "k_eq_v", "n_kv_groups": 1},
    }
    configs = {
        label: ModelConfig(preset="tiny", vocab_size=257, block_size=72, n_layer=2, n_head=4, attention_options=o)
        for label, o in variants.items()
    }
    r = measure_inference(configs, 2, 8, 3, 64, 1, torch.device("cpu"), torch.float32)
    std = r["standard"]
    assert std.cache_bytes_per_token == std.analytic_bytes_per_token == 2 * 2 * 128 * 4  # layers x (K, V) x C x fp32
    for label in variants:
        assert r[label].cache_bytes_per_token == r[label].analytic_bytes_per_token, label
        assert len(r[label].prefill_times) == 1 and len(r[label].decode_times) == 3
    assert r["k_eq_v"].cache_bytes_per_token / std.cache_bytes_per_token == 0.5
    assert r["q_mqa"].cache_bytes_per_token / std.cache_bytes_per_token == 1 / 8
    assert len(std.generate_times) == len(std.reference_times) == 3
    for label in variants:  # the cache of 2 rows x 65 tokens is allocated at once: the peak holds at least it
        assert r[label].peak_bytes >= 130 * r[label].cache_bytes_per_token, label
    # one K/V head: 1/8 of standard's cache. (Not asserted for k_eq_v: its decode re-rotates the raw cached keys of a
    # layer at every step, a transient of about that layer's cache, which at 2 layers eats most of the saving.)
    assert r["q_mqa"].peak_bytes < std.peak_bytes


def test_decode_peak_profiled_in_chunks_equals_one_window(monkeypatch):
    """The CPU decode peak is profiled in chunks (one window of 1,025 steps held more than 12 GB of profiler events):
    the chunks' running sums chain to exactly the one-window peak, also for chunks that split the cache's growth."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import bench_inference

    from lightning_cqk.model import GPT

    torch.manual_seed(0)
    model = GPT(ModelConfig(preset="tiny", vocab_size=257, block_size=40, n_layer=2, n_head=4)).eval()
    peaks, windows = {}, []
    real = bench_inference._profiled
    monkeypatch.setattr(bench_inference, "_profiled", lambda fn: windows.append(1) or real(fn))
    for chunk in (10_000, 7, 1):
        monkeypatch.setattr(bench_inference, "PROFILE_CHUNK", chunk)
        windows.clear()
        peaks[chunk] = bench_inference.peak_decode_bytes(model, 2, 30, torch.device("cpu"))
        assert len(windows) == -(-31 // chunk), (chunk, len(windows))  # 31 forwards, no window over `chunk` of them
    assert peaks[7] == peaks[1] == peaks[10_000] > 0, peaks
