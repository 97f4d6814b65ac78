"""configs/papers/: every published setting parses through the real CLI, builds on the meta device with the shapes
its YAML states, and has the published parameter count where the paper gives one (PUBLISHED below)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml

from lightning_cqk.cli.trainer import CQKCLI
from lightning_cqk.optim import MuonAdamW, build_optimizer

REPO = Path(__file__).resolve().parents[1]
PAPERS = REPO / "configs" / "papers"
CONFIGS = sorted(PAPERS.rglob("*.yaml"))

#: Published total parameter counts, in millions rounded as the source prints them (None: not published).
PUBLISHED: dict[str, float | None] = {
    # arXiv 2606.04032, official comprehensive_flop_analysis_300M.json (docs/papers.md section 2.2)
    "qkv_sharing/300m_qkv.yaml": 305.53,
    "qkv_sharing/300m_k_eq_v.yaml": 284.54,
    "qkv_sharing/300m_q_eq_k.yaml": 284.54,
    "qkv_sharing/300m_q_eq_k_eq_v.yaml": 263.55,
}
#: Sizes the papers only name ("300M", "1.2B", "~1B", "60M"): the baseline's count must lie within this fraction of
#: it (arXiv 2606.04032 does not compensate its variants' smaller attention, so only its QKV models are checked;
#: arXiv 2510.11602's sizes are the names of the Qwen/Pythia models it starts from, whose vocabularies differ).
NOMINAL = {"qkv_sharing/300m_qkv": (300, 0.05), "qkv_sharing/1.2b_qkv": (1200, 0.05), "quack/mha": (1000, 0.05),
           "coupled_qk/60m": (60, 0.06)}  # fmt: skip
SHAPE_FIELDS = ("n_layer", "n_head", "n_embd", "mlp_hidden", "block_size")


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])
    monkeypatch.chdir(tmp_path)  # the logger's run directory is resolved (not created) under ./runs


def test_every_paper_config_is_listed():
    names = {str(p.relative_to(PAPERS)) for p in CONFIGS}
    assert set(PUBLISHED) <= names
    assert len(names) == 23, sorted(names)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(PAPERS)))
def test_paper_config_parses_builds_on_meta_and_has_the_published_size(path: Path):
    name = str(path.relative_to(PAPERS))
    with torch.device("meta"):
        cli = CQKCLI(args=["--config", str(path)], run=False)
    model = cli.model.model
    assert next(model.parameters()).device.type == "meta"
    # The resolved shapes are the YAML's (explicit fields, independent of how presets resolve through the CLI).
    stated = yaml.safe_load(path.read_text())["model"]["config"]
    for key in SHAPE_FIELDS:
        assert getattr(cli.model.config, key) == stated[key], (name, key)
    assert cli.model.config.block_size == cli.datamodule.seq_len
    assert cli.model.config.vocab_size == cli.datamodule.vocab_size
    total = model.num_parameters()["total"]
    if PUBLISHED.get(name) is not None:
        assert round(total / 1e6, 2) == PUBLISHED[name], (name, total)
    for prefix, (nominal, tolerance) in NOMINAL.items():
        if name.startswith(prefix):
            assert abs(total / 1e6 - nominal) <= tolerance * nominal, (name, total)
    optimizer = build_optimizer(model, cli.model.optim, fused=False)  # the optimizer the run would build
    assert isinstance(optimizer, MuonAdamW) == (cli.model.optim.name == "muon")


def test_qkv_sharing_recipe_fields():
    """The recipe of arXiv 2606.04032's official code, as resolved by the CLI (one variant stands for all)."""
    with torch.device("meta"):
        cli = CQKCLI(args=["--config", str(PAPERS / "qkv_sharing" / "300m_k_eq_v.yaml")], run=False)
    c, o = cli.model.config, cli.model.optim
    assert (c.padded_vocab_size, c.position, c.bias, c.residual_init) == (50304, "learned", True, "plain")
    assert (c.embd_dropout_p, c.attn_dropout_p, c.resid_dropout_p) == (0.0, 0.0, 0.1)
    assert (o.lr, o.weight_decay_scope, o.warmup_steps, o.min_lr_ratio) == (2e-4, "all", 500, 0.1)
    assert cli.trainer.accumulate_grad_batches * cli.datamodule.batch_size * 2048 == 2_359_296
    spike = next(cb for cb in cli.trainer.callbacks if type(cb).__name__ == "LossSpikeMonitor")
    assert spike.max_grad_norm == 100.0


def test_a_paper_recipe_trains_end_to_end_when_shrunk(tmp_path: Path):
    """The arXiv 2606.04032 recipe (learned positions, biases, padded vocabulary, plain init, residual-only dropout,
    decay on all parameters, the grad-norm skip rule's callbacks) runs through `fit`, shrunk to a few CPU steps."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(f'{{"text": "Document {i}: queries, keys and values. {"abc " * (20 + i)}"}}\n' for i in range(40))
    )
    from lightning_cqk.cli import main

    shrink = {"n_layer": 2, "n_embd": 64, "n_head": 4, "mlp_hidden": 128}
    main(
        ["fit", "--config", str(PAPERS / "qkv_sharing" / "300m_q_gqa4.yaml")]
        + [f"--model.config.{k}={v}" for k, v in shrink.items()]
        + [f"--data.source={corpus}", "--data.corpus=null", f"--data.data_dir={tmp_path / 'shards'}"]
        + ["--data.tokenizer=bytes", "--data.seq_len=32", "--data.batch_size=2", "--data.val_batch_size=2"]
        + ["--data.num_workers=0", "--data.prepare_workers=1", "--data.val_fraction=0.2", "--budget.tokens=null"]
        + ["--trainer.max_steps=2", "--trainer.accumulate_grad_batches=2", "--trainer.val_check_interval=2"]
        + ["--trainer.limit_val_batches=1", "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false"]
    )
    run = next((tmp_path / "runs" / "papers-qkv_sharing-300m-q_gqa4").iterdir())
    saved = yaml.safe_load((run / "config.yaml").read_text())["model"]["config"]
    assert (saved["vocab_multiple"], saved["residual_init"], saved["resid_dropout"]) == (64, "plain", 0.1)
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert ckpt["state_dict"]["model.wte.weight"].shape == (320, 64)  # 257 byte ids padded to a multiple of 64
    assert ckpt["global_step"] == 2
