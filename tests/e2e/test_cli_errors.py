"""What a newcomer meets first (issue 18): a user error printed alone (its traceback in a log file, `--debug` prints
it), a bug with its traceback, only the warnings that matter, progress lines in a log file, and a `--help` that does
not import torch or Lightning."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from lightning_cqk.cli import main
from lightning_cqk.cli import warnings as warning_filters
from lightning_cqk.cli.error_report import DEBUG_ENV, LOG_DIR_ENV, pop_debug, user_errors_reported
from lightning_cqk.errors import ConfigError, UserError

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs" / "quickstart.yaml"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(LOG_DIR_ENV, str(tmp_path / "log"))
    monkeypatch.delenv(DEBUG_ENV, raising=False)


def _from_shell(monkeypatch, *args: str) -> None:
    """Run `lightning_cqk <args>` as the console script does (main() reads sys.argv)."""
    monkeypatch.setattr(sys, "argv", ["lightning_cqk", *args])
    main()


def test_help_sweep_and_report_help_import_neither_torch_nor_lightning():
    code = (
        "import sys\n"
        "from lightning_cqk.cli import main\n"
        "for argv in (['--help'], ['sweep', '--help'], ['report', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as err:\n"
        "        assert err.code in (0, None), err\n"
        "print(sorted(m for m in ('torch', 'lightning', 'jsonargparse') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: lightning_cqk sweep" in done.stdout and "usage: lightning_cqk report" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_user_error_prints_alone_and_its_traceback_goes_to_the_log(monkeypatch, tmp_path):
    args = ["fit", "--config", str(QUICKSTART), "--model.config.attention", "stndard"]
    with pytest.raises(SystemExit) as done:
        _from_shell(monkeypatch, *args, "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"))
    message = str(done.value.code)  # what the user sees on stderr, exit status 1
    assert message.startswith("lightning_cqk fit: Unknown attention backend 'stndard'. Did you mean 'standard'?")
    log = tmp_path / "log" / "last-error.log"
    assert message.splitlines()[1] == f"(traceback: {log}; --debug or {DEBUG_ENV}=1 prints it)"
    assert len(message.splitlines()) == 2 and "Traceback" not in message
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "in get_attention" in text and "stndard" in text

    with pytest.raises(ConfigError, match="Unknown attention backend 'stndard'"):  # --debug: the traceback
        _from_shell(monkeypatch, *args, "--debug", "--trainer.logger.init_args.save_dir", str(tmp_path / "r2"))


def test_only_user_errors_are_shortened(tmp_path):
    with pytest.raises(SystemExit) as done, user_errors_reported("prepare", debug=False):
        raise ConfigError("data.seq_len=0 must be >= 1.")
    assert str(done.value.code).splitlines()[0] == "lightning_cqk prepare: data.seq_len=0 must be >= 1."
    with pytest.raises(KeyError), user_errors_reported("prepare", debug=False):  # a bug keeps its traceback
        raise KeyError("bug")
    with pytest.raises(ValueError), user_errors_reported("prepare", debug=False):  # ValueError alone is not one
        raise ValueError("not a user error")
    with pytest.raises(UserError), user_errors_reported("prepare", debug=True):
        raise ConfigError("shown with its traceback")


def test_debug_comes_from_the_flag_or_the_environment(monkeypatch):
    assert pop_debug(["fit", "--debug", "--config", "x"]) == (True, ["fit", "--config", "x"])
    assert pop_debug(["fit"]) == (False, ["fit"])
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert pop_debug(["fit"]) == (True, ["fit"])
    monkeypatch.setenv(DEBUG_ENV, "0")
    assert pop_debug(["fit"]) == (False, ["fit"])


def test_warning_filters_hide_exactly_the_listed_messages():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warning_filters.install()
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning, stacklevel=1)
        warnings.warn("Your `IterableDataset` has `__len__` defined. In combination ...", UserWarning, stacklevel=1)
        warnings.warn("The 'train_dataloader' does not have many workers which may be a bottleneck.", stacklevel=1)
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", DeprecationWarning, stacklevel=1)  # category
        warnings.warn("Your model has NaN weights", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == [
        "`isinstance(treespec, LeafSpec)` is deprecated",
        "Your model has NaN weights",
    ]
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    logger.addHandler(handler)
    try:
        logger.warning("💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]")
        logger.warning("`Trainer.fit` stopped: `max_steps=2` reached.")
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == ["`Trainer.fit` stopped: `max_steps=2` reached."]


def test_progress_is_one_line_per_interval_when_stdout_is_not_a_terminal(monkeypatch, tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"text": f"Document {i}. " + "Queries meet keys. " * 20}) + "\n" for i in range(40))
    )
    with warnings.catch_warnings():
        _from_shell(
            monkeypatch,
            "fit",
            "--config",
            str(QUICKSTART),
            f"--data.source={corpus}",
            f"--data.data_dir={tmp_path / 'shards'}",
            "--data.seq_len=32",
            "--data.batch_size=4",
            "--data.val_fraction=0.2",
            "--trainer.max_steps=4",
            "--trainer.val_check_interval=2",
            "--trainer.limit_val_batches=1",
            "--trainer.log_every_n_steps=2",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
            "--model.optim.warmup_steps=1",
        )
    out = capsys.readouterr().out  # pytest's capture is not a TTY, as a log file is not
    assert "\r" not in out
    lines = [line for line in out.splitlines() if line.startswith(("step ", "validation: "))]
    assert [line.split(" |")[0] for line in lines] == [
        "step 2/4 (50%)",
        "validation: step 2/4 (50%)",
        "step 4/4 (100%)",
        "validation: step 4/4 (100%)",
    ]
    assert "train/loss=" in lines[0] and "val/loss=" in lines[1]


def test_a_bad_option_is_four_lines_not_the_hundred_line_usage(capsys):
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", str(QUICKSTART), "--trainer.max_stepz", "3"])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "usage: lightning_cqk fit [options]",
        "tip: For details of accepted options run: lightning_cqk fit --help",
        "error: Unrecognized arguments: --trainer.max_stepz 3",
        "hint: 'trainer.max_stepz' is not a known key in a --config file or on the command line. "
        "Did you mean 'trainer.max_steps' or 'trainer.max_time'?",
    ]


@pytest.mark.slow
def test_a_pubmed_launch_prints_no_repeated_library_noise(tmp_path):
    """Issue 35 item 9: every PubMed launch printed torch's DataLoader-worker warning three times, Lightning's
    "`max_epochs` was not set" (the token budget sets the length) and a FLOPs column of zeros with "0 Total Flops"."""
    source = tmp_path / "abstracts.jsonl"
    source.write_text("".join(json.dumps({"text": f"Abstract {i}. " + "Keys meet queries. " * 30}) + "\n"
                              for i in range(60)))  # fmt: skip
    args = ["fit", "--config", str(REPO / "configs" / "pubmed.yaml"), "--data.corpus=null", f"--data.source={source}",
            "--data.tokenizer=bytes", f"--data.data_dir={tmp_path / 'shards'}", "--data.num_workers=64",
            "--model.config.n_layer=1", "--model.config.n_embd=32", "--model.config.n_head=2",
            "--model.config.mlp_hidden=64", "--data.seq_len=64", "--data.batch_size=4", "--budget.tokens=5120",
            "--model.optim.warmup_steps=2", "--trainer.val_check_interval=20", "--trainer.limit_val_batches=2",
            "--trainer.accumulate_grad_batches=1",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "lightning_cqk", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "Run summary" in out and "Total params" in out
    for noise in ("worker processes in total", "`max_epochs` was not set", "Total Flops", "FLOPs"):
        assert noise not in out, noise
    assert out.count("DataLoader workers (data.num_workers) on") == 1, "said once, with the flag that fits"
