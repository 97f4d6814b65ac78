"""`make bench` (benchmarks/bench.py) runs end to end in a subprocess and prints one table with every section."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_prints_every_section(tmp_path, shared_data):
    text = tmp_path / "corpus.jsonl"
    docs = [{"text": f"Document {i}: the quick brown fox jumps over the lazy dog. " * 20} for i in range(100)]
    text.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    env = dict(
        os.environ, PYTHONPATH=str(REPO_ROOT), LIGHTNING_CQK_GPT2_BPE=str(shared_data / "gpt2_bpe" / "gpt2.tiktoken")
    )
    args = ["--device", "cpu", "--presets", "tiny:bytes:2x16", "tiny:gpt2:2x16", "--backends", "coupled", "k_eq_v"]
    args += ["--steps", "2", "--warmup", "1", "--rounds", "1", "--prepare_rounds", "1", "--loader_seconds", "0.2"]
    args += ["--prepare_source", str(text), "--threads", "1"]
    args += ["--decode_steps", "2", "--decode_tokens", "8"]
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "bench.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    table = out.stdout
    assert "load average" in table.splitlines()[0]
    for preset in ("tiny/bytes 2x16", "tiny/gpt2 2x16"):
        for measure in (
            "Lightning step vs plain loop",
            "loader (0 workers) vs training step",
            "coupled: step time",
            "coupled: activations",
            "k_eq_v: peak memory",
            "standard: step time",
            "k_eq_v: KV cache bytes/token",
            "coupled: decode tokens/s",
            "k_eq_v: peak memory, decoding 8 tokens",
            "standard: generate_reference (no cache",
        ):
            assert any(preset in line and measure in line for line in table.splitlines()), (preset, measure, table)
    assert "prepare with gpt2, MB/s of text per worker" in table
    assert "error" not in table


def test_bench_composition_rows_are_against_their_base():
    """`<base>+<transform>` rows (issue 15) are measured with their base in the same rounds and compared with it."""
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    try:
        import bench
    finally:
        sys.path.remove(str(REPO_ROOT / "benchmarks"))
    assert {f"{b}+{t}" for b in ("standard", "gqa", "differential", "mla") for t in ("coupled", "invertible")} <= set(
        bench.VARIANTS
    )
    variants = bench.backend_variants(["differential+invertible"])
    assert list(variants) == ["standard", "differential", "differential+invertible"]
    args = type("Args", (), dict(backends=["differential+invertible"], compile=False, warmup=0, steps=1, profile=None,
                                 peak_flops=None))()  # fmt: skip
    rows = bench.bench_backends(
        bench.Preset.parse("tiny:bytes:1x8"), args, bench.torch.device("cpu"), bench.torch.float32
    )
    row = next(r for r in rows if r.measure == "differential+invertible: step time vs differential")
    base = next(r for r in rows if r.measure == "differential: step time")
    assert row.reference == base.value and row.key == ("time", "differential+invertible")
    assert bench.TARGETS[row.key] == ("<=", 1.10)


def test_backends_that_do_not_fit_together_are_timed_one_at_a_time():
    """Issue 32 item 7: every variant's model and optimizer stayed resident (150m on a GPU could run out of memory).
    They stay together while their states fit half the device, else each is built, timed and freed in turn."""
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    try:
        import bench
    finally:
        sys.path.remove(str(REPO_ROOT / "benchmarks"))
    labels, state = ["standard", "mla", "coupled"], {"standard": 4.0, "mla": 5.0, "coupled": 4.0}
    assert bench.resident_groups(labels, state, None) == [labels]  # CPU: host memory, all together
    assert bench.resident_groups(labels, state, 13.0) == [labels]
    assert bench.resident_groups(labels, state, 12.0) == [["standard"], ["mla"], ["coupled"]]
