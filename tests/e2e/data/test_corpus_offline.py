"""A named corpus that cannot be downloaded fails at once in one paragraph: the corpus, the reason (offline, no
`datasets`, the Hub refused) and the command again with `--data.source PATH`, which works when pasted with a local
file (issue 26). Corpus and data errors print alone, without a traceback. Nothing here touches the network: offline
is simulated (HF_HUB_OFFLINE, an HF_ENDPOINT on a closed local port, a stand-in `datasets`)."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from lightning_cqk.data import corpora
from lightning_cqk.data.corpora import DownloadUnavailable, download_corpus, get_corpus, local_source_command
from lightning_cqk.errors import UserError

REPO = Path(__file__).resolve().parents[3]
FIT = ["lightning_cqk", "fit", "--config", "configs/pubmed.yaml"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is: a connection is refused at once


def test_offline_by_setting_names_the_corpus_the_reason_and_the_local_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sys, "argv", [*FIT, "--data.source", "null", "--trainer.max_steps", "10"])
    with pytest.raises(DownloadUnavailable) as err:
        download_corpus(get_corpus("pubmed"), tmp_path)
    message = str(err.value)
    assert isinstance(err.value, UserError) and "\n" not in message
    assert "corpus 'pubmed'" in message and "ccdv/pubmed-summarization" in message and "HF_HUB_OFFLINE=1" in message
    # the source given (null) is replaced, everything else is kept
    assert "`lightning_cqk fit --config configs/pubmed.yaml --trainer.max_steps 10 --data.source PATH`" in message


def test_an_unreachable_hub_fails_at_once_without_retrying(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")

    def no_download(*args, **kwargs):
        raise AssertionError("load_dataset must not be called: the Hub is unreachable")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=no_download))
    with pytest.raises(DownloadUnavailable, match=r"127\.0\.0\.1:\d+ cannot be reached from this machine \(offline"):
        download_corpus(get_corpus("wikitext2"), tmp_path)


def test_without_datasets_the_message_says_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    monkeypatch.setattr(sys, "argv", ["lightning_cqk", "prepare", "--corpus", "c4", "--output_dir", "d"])
    with pytest.raises(DownloadUnavailable) as err:
        download_corpus(get_corpus("c4"), tmp_path)
    assert "`datasets` package is not installed" in str(err.value)
    assert "`lightning_cqk prepare --corpus c4 --output_dir d --source PATH`" in str(err.value)


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        (PermissionError("403 Client Error: Forbidden for url https://hf.co/api/datasets/x"), "the Hub refused"),
        (ConnectionError("Max retries exceeded with url"), "the download failed"),
    ],
)
def test_a_failed_download_says_whether_the_hub_refused(tmp_path, monkeypatch, raised, said):
    monkeypatch.setattr(corpora, "hub_unreachable", lambda: None)

    def load_dataset(*args, **kwargs):
        raise raised

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(DownloadUnavailable, match=said) as err:
        download_corpus(get_corpus("openwebtext"), tmp_path)
    assert err.value.__cause__ is raised
    assert not list(tmp_path.glob("*.part")), "a failed download leaves no partial file"


def test_outside_the_command_line_both_forms_are_named():
    assert local_source_command(["pytest"]) == (
        "`lightning_cqk fit ... --data.source PATH` (`lightning_cqk prepare ... --source PATH`)"
    )
    assert local_source_command(["x", "fit", "--data.source=a.jsonl", "--seed_everything", "3"]) == (
        "`lightning_cqk fit --seed_everything 3 --data.source PATH`"
    )


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **extra)
    env.pop("LIGHTNING_CQK_DEBUG", None)
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def _lightning_cqk(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lightning_cqk", *args],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_offline_fit_prints_one_paragraph_whose_command_works_when_pasted(tmp_path: Path):
    """The real command line: the named corpus offline, then the suggested command with a local PubMed file."""
    config = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text())
    config["trainer"].update(max_steps=2, val_check_interval=2, limit_val_batches=1, enable_progress_bar=False)
    config["trainer"]["logger"]["init_args"]["save_dir"] = str(tmp_path / "runs")
    config["trainer"]["callbacks"] = []
    config["model"]["config"].update(n_layer=1, n_embd=16, n_head=2)
    config["model"]["optim"]["warmup_steps"] = 1
    config["data"]["init_args"].update(
        corpus="pubmed", source=None, data_dir=str(tmp_path / "shards"), seq_len=16, batch_size=2
    )
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(config))
    offline = _lightning_cqk(
        ["fit", "--config", "small.yaml"], tmp_path, HF_HUB_OFFLINE="1", LIGHTNING_CQK_LOG_DIR=str(tmp_path)
    )
    assert offline.returncode == 1
    assert "Traceback" not in offline.stderr, offline.stderr[-3000:]
    (message,) = [line for line in offline.stderr.splitlines() if line.startswith("lightning_cqk fit:")]
    assert "corpus 'pubmed'" in message and "offline" in message
    command = re.search(r"`(lightning_cqk fit [^`]*--data\.source PATH)`", message).group(1)
    assert command == "lightning_cqk fit --config small.yaml --data.source PATH"

    with (tmp_path / "abstracts.jsonl").open("w") as f:  # a local copy, in a format the message names
        for i in range(80):
            f.write(json.dumps({"text": f"Abstract {i}. The protein binds the receptor in vivo. " * 3}) + "\n")
    pasted = shlex.split(command.replace("PATH", str(tmp_path / "abstracts.jsonl")))[1:]
    run = _lightning_cqk(pasted, tmp_path, HF_HUB_OFFLINE="1")
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "shards" / "manifest.json").is_file()


def test_a_shared_pubmed_folder_prints_its_refusal_without_a_traceback(shared_data: Path, tmp_path: Path):
    run = _lightning_cqk(
        [
            "fit",
            "--config",
            str(REPO / "configs" / "pubmed.yaml"),
            "--data.source",
            str(shared_data / "pubmed"),
            f"--data.data_dir={tmp_path / 'shards'}",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
            "--memory_check=off",  # the 60m config on a CPU is refused for memory first; the corpus is the point here
        ],
        tmp_path,
        LIGHTNING_CQK_LOG_DIR=str(tmp_path),
    )
    assert run.returncode == 1
    assert "Traceback" not in run.stderr and "other_files" in run.stderr, run.stderr[-3000:]


def test_prepare_of_a_named_corpus_needs_no_source_and_offline_names_the_local_command(tmp_path, monkeypatch):
    """`lightning_cqk prepare --corpus pubmed --output_dir D` (no --source: download) reaches the download, which
    offline fails in one paragraph whose command, with a local file as PATH, prepares the corpus."""
    from lightning_cqk.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "shards"
    argv = ["prepare", "--corpus", "pubmed", "--output_dir", str(out)]
    monkeypatch.setattr(sys, "argv", ["lightning_cqk", *argv])  # the message repeats the command as typed
    with pytest.raises(UserError) as err:
        main(argv)
    message = str(err.value)
    assert "corpus 'pubmed'" in message and "HF_HUB_OFFLINE=1" in message
    command = re.search(r"`(lightning_cqk prepare [^`]*--source PATH)`", message).group(1)
    local = tmp_path / "abstracts.jsonl"
    local.write_text(
        "".join(json.dumps({"text": f"Abstract {i}: aspirin lowers fever {i % 7} times."}) + "\n" for i in range(40))
    )
    argv = shlex.split(command.replace("PATH", str(local)))[1:]
    main(argv)
    assert (out / "manifest.json").is_file()
