"""The worked example of issue 42 item 6: `examples/sigmoid_attention`, an attention plugin outside the package.

It is installed as a user would (offline: `pip install --no-deps --no-build-isolation --no-index --target <dir>` of a
copy, so the source folder stays clean), then every command runs in a child process with only that folder added to
PYTHONPATH: `check-backend sigmoid` passes (two rows noted, none failed), a short `fit` trains it by its entry-point
name, `generate` samples from the checkpoint, the same checkpoint is refused by name where the plugin is not
installed, and a 2-seed micro study (sigmoid vs standard) writes its report. docs/your-attention.md shows the same
commands' output.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tiny_run import QUICKSTART, REPO, child_env, tiny_command, write_tiny_corpus

EXAMPLE = REPO / "examples" / "sigmoid_attention"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The example installed by pip into a folder of its own (no dependencies, no network, no build isolation)."""
    root = tmp_path_factory.mktemp("example")
    shutil.copytree(EXAMPLE, root / "src", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = root / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*pip, "--target", str(target), str(root / "src")], check=True, capture_output=True, timeout=300)
    assert (target / "cqk_sigmoid" / "attention.py").is_file()
    return target


def lightning_cqk(*args: str, site: Path | None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = child_env(*([site] if site else []))
    command = [sys.executable, "-m", "lightning_cqk", *args]
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_check_backend_passes_the_installed_example(site):
    done = lightning_cqk("check-backend", "sigmoid", site=site)
    assert done.returncode == 0, done.stdout + done.stderr
    table = done.stdout
    assert "check-backend sigmoid (cqk_sigmoid.attention:SigmoidAttention" in table
    assert table.splitlines()[-1] == "13 passed, 0 failed, 2 not applicable (noted)"
    assert "one path only" in table and "no softmax maps" in table  # said in their rows, not passed


def test_fit_then_generate_and_the_checkpoint_is_refused_by_name_without_the_plugin(site, tiny_shards, tmp_path):
    runs = tmp_path / "runs"
    fit = tiny_command(tiny_shards, runs, "--model.config.attention=sigmoid", "--trainer.max_steps=3")
    done = subprocess.run(fit, env=child_env(site), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (ckpt,) = runs.glob("*/*/checkpoints/last.ckpt")
    args = ("generate", "--checkpoint", str(ckpt), "--prompt", "Queries", "--max_new_tokens", "8", "--seed", "1")
    sampled = lightning_cqk(*args, site=site)
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout.startswith("Queries") and len(sampled.stdout) > len("Queries")
    refused = lightning_cqk(*args, site=None)  # the plugin is not installed in this environment
    assert refused.returncode == 1
    message = refused.stderr.strip().splitlines()[0]
    assert message.startswith(
        f"lightning_cqk generate: The checkpoint {ckpt} was made with the attention backend 'sigmoid', which is not "
        "installed here"
    ), refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.slow
def test_a_two_seed_micro_study_of_the_example_gets_a_report(site, tmp_path):
    corpus = write_tiny_corpus(tmp_path / "corpus.jsonl")
    overrides = {
        "data.source": str(corpus),
        "data.data_dir": str(tmp_path / "shards"),
        "data.val_fraction": 0.2,
        "data.seq_len": 16,
        "data.batch_size": 2,
        "model.config.n_layer": 1,
        "model.config.n_embd": 16,
        "model.config.n_head": 2,
        "model.config.mlp_hidden": 32,
        "model.optim.warmup_steps": 1,
        "budget.tokens": 6 * 2 * 16,  # 6 steps of 2 windows of 16 bytes
        "trainer.val_check_interval": 3,  # validates at its last step
        "trainer.limit_val_batches": 1,
        "trainer.log_every_n_steps": 1,
        "trainer.enable_progress_bar": False,
        "trainer.enable_model_summary": False,
    }
    spec = {
        "study": "sigmoid-micro",
        "metric": "val/ppl",
        "baseline": {"arm": "standard"},
        "axes": {"arm": {name: {"model.config.attention": name} for name in ("standard", "sigmoid")}},
        "profiles": {
            "paper": {"configs": [str(QUICKSTART)]},
            "cpu": {"configs": [str(QUICKSTART)], "seeds": [1, 2], "overrides": overrides},
        },
    }
    (tmp_path / "micro.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "study"
    swept = lightning_cqk("sweep", "micro.yaml", "--profile", "cpu", "--output", str(out), site=site, cwd=tmp_path)
    assert swept.returncode == 0, swept.stdout[-3000:] + swept.stderr[-3000:]
    reported = lightning_cqk("report", str(out), site=site, cwd=tmp_path)
    assert reported.returncode == 0, reported.stdout[-3000:] + reported.stderr[-3000:]
    report = (out / "report" / "sigmoid-micro.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith(("| standard (baseline) | 2 |", "| sigmoid | 2 |"))]
    assert len(rows) == 2, report  # both arms, two seeds each, with the effect of sigmoid against standard
