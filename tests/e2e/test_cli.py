"""The command line: every shipped YAML parses, the quickstart trains, print_config round-trips, links hold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lightning_cqk import attention
from lightning_cqk.cli import main
from lightning_cqk.cli.trainer import CQKCLI

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs" / "quickstart.yaml"
# Configs over one TokenDataModule (the tiny overrides below set its source); mixture configs (MixtureDataModule)
# are smoke-run by tests/e2e/data/test_paper_configs.py.
FULL_CONFIGS = sorted(p for p in (REPO / "configs").glob("*.yaml") if "MixtureDataModule" not in p.read_text())
FRAGMENTS = sorted((REPO / "configs" / "attention").glob("*.yaml"))

TEXT = (
    "The quick brown fox jumps over the lazy dog. Attention is a weighted average of values whose weights come "
    "from the similarity of queries and keys. "
)


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    """LightningCLI warns when pytest's own argv is present beside `args`."""
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory) -> Path:
    """A small jsonl corpus with enough documents for a train/val split (shards prepared once per module)."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    with path.open("w") as f:
        for i in range(60):
            f.write(json.dumps({"text": f"Document {i}. " + TEXT * (3 + i % 4)}) + "\n")
    return path


def tiny_overrides(tmp_path: Path, corpus: Path, steps: int = 4) -> list[str]:
    return [
        f"--data.source={corpus}",
        f"--data.data_dir={corpus.parent / 'shards'}",
        "--data.seq_len=32",
        "--data.batch_size=4",
        "--data.val_fraction=0.2",
        f"--trainer.max_steps={steps}",
        "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=2",
        "--trainer.log_every_n_steps=1",
        "--trainer.enable_progress_bar=false",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        "--model.optim.warmup_steps=1",
    ]


@pytest.mark.parametrize("config", FULL_CONFIGS, ids=lambda p: p.name)
def test_every_full_config_parses(config: Path, tmp_path: Path, tiny_corpus: Path):
    cli = CQKCLI(args=["--config", str(config), *tiny_overrides(tmp_path, tiny_corpus)], run=False)
    assert cli.model.config.block_size == cli.datamodule.seq_len
    assert cli.model.config.vocab_size == cli.datamodule.vocab_size


@pytest.mark.parametrize("fragment", FRAGMENTS, ids=lambda p: p.name)
def test_every_attention_fragment_parses_and_builds(fragment: Path, tmp_path: Path, tiny_corpus: Path):
    args = ["--config", str(QUICKSTART), "--config", str(fragment), *tiny_overrides(tmp_path, tiny_corpus)]
    cli = CQKCLI(args=args, run=False)
    wanted = yaml.safe_load(fragment.read_text())["model"]["config"]["attention"]
    assert wanted in attention.available()
    assert cli.model.config.attention == wanted


def test_unknown_attention_name_lists_choices(tmp_path: Path, tiny_corpus: Path, capsys):
    args = ["--config", str(QUICKSTART), *tiny_overrides(tmp_path, tiny_corpus), "--model.config.attention=nope"]
    with pytest.raises((ValueError, SystemExit)) as err:
        CQKCLI(args=args, run=False)
    message = str(err.value) + capsys.readouterr().err
    assert "nope" in message and "standard" in message


def test_quickstart_trains_validates_checkpoints_and_summarises(tmp_path: Path, tiny_corpus: Path, capsys):
    main(["fit", "--config", str(QUICKSTART), *tiny_overrides(tmp_path, tiny_corpus)])
    out = capsys.readouterr().out
    assert "Run summary" in out and "tokens seen" in out and "tensorboard --logdir" in out
    run_dirs = list((tmp_path / "runs" / "quickstart").iterdir())
    assert [d.name for d in run_dirs] == ["standard-tiny-s1337"]
    run = run_dirs[0]
    assert (run / "config.yaml").is_file()
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert list(run.glob("events.out.tfevents.*"))
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["data"]["init_args"]["seq_len"] == 32  # block_size is a link target, derived from it
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["hyper_parameters"]["config"]["block_size"] == 32
    assert ckpt["hyper_parameters"]["config"]["vocab_size"] == 257


def test_second_run_gets_its_own_directory(tmp_path: Path, tiny_corpus: Path):
    for _ in range(2):
        main(["fit", "--config", str(QUICKSTART), *tiny_overrides(tmp_path, tiny_corpus, steps=1)])
    names = sorted(d.name for d in (tmp_path / "runs" / "quickstart").iterdir())
    assert names == ["standard-tiny-s1337", "standard-tiny-s1337-2"]


def test_print_config_round_trip_trains_the_same_run(tmp_path: Path, tiny_corpus: Path):
    """The printed config, passed back with --config, gives the same losses as the original command line."""
    args = tiny_overrides(tmp_path, tiny_corpus, steps=3)
    printed = subprocess.run(
        [sys.executable, "-m", "lightning_cqk", "fit", "--config", str(QUICKSTART), *args, "--print_config"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout
    saved = tmp_path / "printed.yaml"
    saved.write_text(printed)

    def losses(cli_args: list[str]) -> list[float]:
        cli = CQKCLI(args=["fit", *cli_args], run=True)
        return [float(cli.trainer.callback_metrics["train/loss"])]

    a = losses(["--config", str(QUICKSTART), *args])
    b = losses(["--config", str(saved)])
    assert a == b


def test_prepare_and_attention_subcommands(tmp_path: Path, tiny_corpus: Path, capsys):
    main(["prepare", "--source", str(tiny_corpus), "--output_dir", str(tmp_path / "p"), "--val_fraction", "0.2"])
    assert (tmp_path / "p" / "manifest.json").is_file()
    main(["attention"])
    out = capsys.readouterr().out
    for name in attention.available():
        assert name in out


@pytest.mark.parametrize("value,expected", [("1", 1), ("3", 3), ("0.5", 0.5), ("1.0", 1.0)])
def test_limit_batches_int_is_a_count_float_a_fraction(value: str, expected, tmp_path: Path, tiny_corpus: Path):
    """`limit_val_batches 1` must mean one batch (Lightning: int = count), not 1.0 = every batch."""
    args = ["--config", str(QUICKSTART), *tiny_overrides(tmp_path, tiny_corpus), f"--trainer.limit_val_batches={value}"]
    cli = CQKCLI(args=args, run=False)
    assert cli.trainer.limit_val_batches == expected
    assert type(cli.trainer.limit_val_batches) is type(expected)
