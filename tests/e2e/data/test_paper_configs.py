"""The paper configs (`configs/{wikitext103,pubmed,openwebtext,mixture}.yaml`) keep their paper-scale settings and
smoke-run tiny on CPU from the shared data folder with command-line overrides (skipped when it is absent)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from lightning_cqk.cli import main

REPO = Path(__file__).resolve().parents[3]
PAPER_CONFIGS = ("wikitext103", "pubmed", "openwebtext", "mixture")

# config -> (corpus, local source under shared/data) for each TokenDataModule / mixture component
LOCAL = {
    "wikitext103": [("wikitext103", "wikitext/wikitext-2-raw-test")],
    "pubmed": [("pubmed", "pubmed/combined")],
    "openwebtext": [("openwebtext", "webtext/c4_en_first1000")],
    "mixture": [("pubmed", "pubmed/combined"), ("c4", "webtext/c4_en_first1000")],
}


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])


@pytest.mark.parametrize("name", PAPER_CONFIGS)
def test_paper_config_settings(name: str):
    config = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())
    data = config["data"]["init_args"]
    assert config["model"]["config"]["preset"] == "60m"
    assert config["trainer"]["precision"] is None  # auto: bf16-mixed on a bf16 GPU
    assert data["tokenizer"] == "gpt2" and data["seq_len"] == 1024
    assert float(config["budget"]["tokens"]) >= 1e9
    corpora = [c["corpus"] for c in data["components"]] if name == "mixture" else [data["corpus"]]
    assert corpora == [corpus for corpus, _ in LOCAL[name]]


@pytest.mark.parametrize("name", PAPER_CONFIGS)
def test_paper_config_smoke_runs_tiny_from_shared_data(name: str, shared_data: Path, tmp_path: Path):
    parts = [
        {"corpus": corpus, "data_dir": str(tmp_path / f"shards-{i}"), "source": str(shared_data / src), "weight": 1.0}
        for i, (corpus, src) in enumerate(LOCAL[name])
    ]
    data = (
        [f"--data.components={json.dumps(parts)}"]
        if name == "mixture"
        else [f"--data.source={parts[0]['source']}", f"--data.data_dir={parts[0]['data_dir']}"]
    )
    main(
        [
            "fit",
            "--config",
            str(REPO / "configs" / f"{name}.yaml"),
            *data,
            f"--data.bpe_file={shared_data / 'gpt2_bpe' / 'gpt2.tiktoken'}",
            "--data.seq_len=32",
            "--data.batch_size=2",
            "--data.num_workers=0",
            "--data.prepare_workers=2",
            "--model.config.preset=tiny",
            "--model.config.n_layer=1",
            "--budget.tokens=128",  # 2 steps of 2 x 32 tokens
            "--trainer.accumulate_grad_batches=1",
            "--trainer.val_check_interval=2",
            "--trainer.limit_val_batches=2",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
            "--model.optim.warmup_steps=1",
        ]
    )
    budgets = list((tmp_path / "runs").rglob("budget.json"))
    assert len(budgets) == 1 and json.loads(budgets[0].read_text())["steps"] == 2
    for part in parts:
        manifest = json.loads((Path(part["data_dir"]) / "manifest.json").read_text())
        assert manifest["tokenizer"] == "gpt2" and manifest["splits"]["val"]["tokens"] > 0
