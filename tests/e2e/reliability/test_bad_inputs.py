"""Every bad input of issue 8 is refused before any training step, with a message that says what is wrong and how to
fix it: config keys, attention backends and options, hybrid patterns, seq_len vs block_size, corpora, shards,
tokenizers, checkpoints of other models, zero budgets, non-UTF-8 text (accepted and counted), busy run directories."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from tiny_run import tiny_args

from lightning_cqk.callbacks import TokenBudget
from lightning_cqk.cli import main
from lightning_cqk.cli.trainer import CQKCLI
from lightning_cqk.data import TokenDataModule, prepare
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM
from lightning_cqk.optim import OptimConfig
from lightning_cqk.run.lock import RunDirectoryInUse, acquire

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])


def cli_args(shards: Path, runs: Path, *extra: str) -> list[str]:
    return tiny_args(shards, runs, "--trainer.max_steps=2", "--trainer.limit_val_batches=1", *extra)


def parse_error(capsys, args: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        CQKCLI(args=args, run=False)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


# ------------------------------------------------------------------------------- config keys, attention options
@dataclass(frozen=True)
class Refusal:
    """A bad input as its delta over the tiny run (`flags`, and `config`: the text of one more config file) and what
    refuses it: at parsing (`parsed`: exit code 2, every string of `says` on stderr) or when the model is built (a
    ValueError matching the regular expression `says[0]`)."""

    name: str
    flags: tuple[str, ...]
    says: tuple[str, ...]
    config: str | None = None
    parsed: bool = True


REFUSALS = [
    Refusal(
        "unknown_config_key_in_a_yaml_file_gets_a_did_you_mean",
        (),
        ("does not accept option 'config.n_layr'", "Did you mean 'model.config.n_layer'"),
        config="model:\n  config:\n    n_layr: 2\n",
    ),
    Refusal(
        "unknown_command_line_flag_gets_a_did_you_mean",
        ("--trainer.max_stepz=3",),
        ("Unrecognized arguments: --trainer.max_stepz", "Did you mean 'trainer.max_steps'"),
    ),
    Refusal(
        "unknown_data_key_gets_a_did_you_mean",
        ("--data.init_args.seq_lenn=8",),
        ("'seq_lenn' is not accepted", "Did you mean 'seq_len'"),
    ),
    Refusal(
        "setting_a_linked_key_says_what_it_is_linked_to",
        ("--model.config.block_size=8",),
        ("model.config.block_size is not set directly: it is linked to data.seq_len", "set --data.seq_len instead"),
    ),
    Refusal(
        "unknown_attention_backend",
        ("--model.config.attention=standrad",),
        (r"Unknown attention backend 'standrad'\. Did you mean 'standard'\? Available",),
        parsed=False,
    ),
    Refusal(
        "unknown_attention_option",
        ("--model.config.attention_options={qk_norms: true}",),
        (r"Unknown option 'qk_norms' .*Did you mean 'qk_norm'",),
        parsed=False,
    ),
]


def refusal_args(refusal: Refusal, shards: Path, tmp_path: Path) -> list[str]:
    args = [*cli_args(shards, tmp_path), *refusal.flags]
    if refusal.config is not None:
        (tmp_path / "bad.yaml").write_text(refusal.config)
        args += ["--config", str(tmp_path / "bad.yaml")]
    return args


@pytest.mark.parametrize("refusal", [r for r in REFUSALS if r.parsed], ids=lambda r: r.name)
def test_a_bad_key_is_refused_when_parsed_saying_what_to_use(refusal: Refusal, tiny_shards, tmp_path, capsys):
    err = parse_error(capsys, refusal_args(refusal, tiny_shards, tmp_path))
    missing = [said for said in refusal.says if said not in err]
    assert not missing, f"{refusal.name}: the refusal does not say {missing}:\n{err}"


@pytest.mark.parametrize("refusal", [r for r in REFUSALS if not r.parsed], ids=lambda r: r.name)
def test_a_bad_attention_setting_is_refused_when_built_saying_what_to_use(refusal: Refusal, tiny_shards, tmp_path):
    with pytest.raises(ValueError, match=refusal.says[0]):
        CQKCLI(args=refusal_args(refusal, tiny_shards, tmp_path), run=False)


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("evn", r"Unknown layer pattern 'evn'\. Named patterns: even, odd"),
        ("1-9", r"Layer 5 in pattern '1-9' is out of range: layers are 1-based, 1\.\.4"),
        ("", r"Empty layer pattern\. Use one of even"),
    ],
)
def test_invalid_hybrid_layer_pattern(pattern: str, message: str):
    with pytest.raises(ValueError, match=r"layer_overrides\[0\]\.pattern: " + message):
        ModelConfig(attention="mlp", layer_overrides=[{"pattern": pattern, "attention": "standard"}])


# ------------------------------------------------------------------------------------------ data and model
@pytest.fixture
def quiet_trainer(make_trainer, tmp_path: Path):
    """Factory: the root `make_trainer`'s Trainer of 2 steps without a logger, rooted in tmp_path."""

    def make(callbacks: list[L.Callback] | None = None, max_steps: int = 2, **kwargs) -> L.Trainer:
        return make_trainer(callbacks or [], max_steps, logger=False, default_root_dir=str(tmp_path), **kwargs)

    return make


class CountSteps(L.Callback):
    steps = 0

    def on_train_batch_end(self, *args) -> None:
        CountSteps.steps += 1


def tiny_module(**config) -> LitLM:
    return LitLM(ModelConfig(**{"vocab_size": 257, "n_layer": 1, "n_embd": 32, "n_head": 2, **config}), OptimConfig())


def test_seq_len_above_block_size_is_refused_before_training(tiny_shards, tmp_path, quiet_trainer):
    CountSteps.steps = 0
    dm = TokenDataModule(data_dir=str(tiny_shards), source=None, seq_len=32, batch_size=2)
    with pytest.raises(ValueError, match=r"data\.seq_len=32 is longer than the model's block_size=16.*Use --data"):
        quiet_trainer(callbacks=[CountSteps()]).fit(tiny_module(block_size=16), datamodule=dm)
    assert CountSteps.steps == 0
    with pytest.raises(ValueError, match="Sequence length 32 exceeds the model's block_size 16; use a shorter"):
        tiny_module(block_size=16).model(torch.zeros(1, 32, dtype=torch.long))


def test_missing_corpus(tmp_path):
    dm = TokenDataModule(data_dir=str(tmp_path / "shards"), source=str(tmp_path / "nowhere" / "*.txt"))
    with pytest.raises(FileNotFoundError, match=r"nowhere/\*\.txt' matches no supported file\. .*\.txt"):
        dm.prepare_data()
    dm = TokenDataModule(data_dir=str(tmp_path / "shards"), source=None)
    with pytest.raises(FileNotFoundError, match=r"No token shards at .* Run `lightning_cqk prepare --source <text>"):
        dm.prepare_data()


def test_empty_corpus(tmp_path):
    (tmp_path / "empty.txt").write_text("  \n\n")
    with pytest.raises(ValueError, match=r"The source holds no documents \(empty files or blank text\)"):
        prepare(str(tmp_path / "empty.txt"), str(tmp_path / "shards"))


def copy_shards(shards: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(shards, to)
    return to


def test_truncated_shard_is_named_with_the_rebuild_command(tiny_shards, tmp_path):
    copy = copy_shards(tiny_shards, tmp_path / "copy")
    (chunk,) = (copy / "train").glob("*.bin")
    chunk.write_bytes(chunk.read_bytes()[:-100])
    dm = TokenDataModule(data_dir=str(copy), source=None, seq_len=16, batch_size=2)
    with pytest.raises(ValueError, match=rf"Shard {chunk} is truncated: .* Rebuild it: `lightning_cqk prepare"):
        dm.setup("fit")


def test_missing_or_corrupt_shard_index(tiny_shards, tmp_path):
    copy = copy_shards(tiny_shards, tmp_path / "copy")
    (copy / "val" / "index.json").write_text('{"chunks": [')
    dm = TokenDataModule(data_dir=str(copy), source=None, seq_len=16, batch_size=2)
    with pytest.raises(ValueError, match=r"The val shard index .*index\.json is corrupt .*Rebuild it"):
        dm.setup("fit")
    (copy / "val" / "index.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"The val shards at .* are incomplete: .*index\.json is missing"):
        dm.setup("fit")


def test_damaged_shard_bytes_stop_at_the_first_batch(tiny_shards, tmp_path):
    copy = copy_shards(tiny_shards, tmp_path / "copy")
    (chunk,) = (copy / "train").glob("*.bin")
    data = bytearray(chunk.read_bytes())
    data[-6000:-2000] = np.full(2000, 60000, dtype=np.uint16).tobytes()  # same size; ids far outside the vocabulary
    chunk.write_bytes(bytes(data))
    dm = TokenDataModule(data_dir=str(copy), source=None, seq_len=16, batch_size=8, shuffle=False)
    dm.setup("fit")
    with pytest.raises(ValueError, match=r"holds token id 60000, outside the vocabulary \(size 257\).*Rebuild it"):
        for _ in dm.train_dataloader():
            pass


def test_shards_made_with_another_tokenizer(tiny_shards):
    dm = TokenDataModule(data_dir=str(tiny_shards), source=None, tokenizer="gpt2", seq_len=16, batch_size=2)
    with pytest.raises(ValueError, match=r"made with tokenizer 'bytes' .* Use data\.tokenizer='bytes', or re-run"):
        dm.setup("fit")


def test_checkpoint_of_another_architecture_or_vocabulary(tiny_shards, tmp_path, quiet_trainer):
    dm = TokenDataModule(data_dir=str(tiny_shards), source=None, seq_len=16, batch_size=2)
    trainer = quiet_trainer(max_steps=1)
    trainer.fit(tiny_module(block_size=16), datamodule=dm)
    ckpt = tmp_path / "one.ckpt"
    trainer.save_checkpoint(ckpt)
    CountSteps.steps = 0
    with pytest.raises(ValueError, match=r"holds another model .*n_layer: checkpoint 1, this run 2.*--config <its run"):
        quiet_trainer(callbacks=[CountSteps()]).fit(
            tiny_module(block_size=16, n_layer=2), datamodule=dm, ckpt_path=ckpt
        )
    with pytest.raises(ValueError, match=r"vocab_size: checkpoint 257, this run 300.*use the tokenizer it was trained"):
        quiet_trainer().validate(tiny_module(block_size=16, vocab_size=300), datamodule=dm, ckpt_path=ckpt)
    assert CountSteps.steps == 0
    # Evaluating a RoPE model at another context length is allowed (no weight depends on it).
    dm32 = TokenDataModule(data_dir=str(tiny_shards), source=None, seq_len=32, batch_size=2)
    quiet_trainer(limit_val_batches=1).validate(tiny_module(block_size=32), datamodule=dm32, ckpt_path=ckpt)


def test_budget_of_zero(tiny_shards, tmp_path):
    with pytest.raises(ValueError, match=r"TokenBudget\.tokens must be positive, got 0: a budget of zero trains"):
        TokenBudget(tokens=0)
    with pytest.raises(ValueError, match=r"trainer\.max_steps is 0: a budget of zero steps trains nothing\. Set"):
        main(["fit", *cli_args(tiny_shards, tmp_path), "--trainer.max_steps=0"])


def test_non_utf8_text_is_replaced_counted_and_reported(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    for i in range(12):
        (tmp_path / "src" / f"doc{i}.txt").write_text(f"document {i} " * 20)
    (tmp_path / "src" / "latin1.txt").write_bytes(b"caf\xe9 cr\xe8me \xff\xfe" + b" more text" * 20)
    manifest = prepare(str(tmp_path / "src"), str(tmp_path / "shards"), val_fraction=0.3)
    replaced = manifest.splits["train"].replaced_bytes + manifest.splits["val"].replaced_bytes
    assert replaced == 4
    saved = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    assert saved["splits"]["train"]["replaced_bytes"] + saved["splits"]["val"]["replaced_bytes"] == 4
    assert "4 bytes that were not UTF-8 were replaced with U+FFFD" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ run directory
HOLD = "import sys, time; from lightning_cqk.run.lock import acquire; acquire(sys.argv[1]); print('held', flush=True); "
HOLD += "time.sleep(120)"


def test_a_run_directory_in_use_by_a_live_run_is_refused(tiny_shards, tmp_path):
    run_dir = tmp_path / "runs" / "quickstart" / "standard-tiny-L1-H2-d16-ff32-s1337"  # the tiny run's
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True, cwd=REPO, env=None
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirectoryInUse, match=rf"in use by a live run \(pid {holder.pid} on host .*kill "):
            main(["fit", *cli_args(tiny_shards, tmp_path / "runs"), "--ckpt_path=last"])
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock"], "nothing written into the live run"
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    messages: list[str] = []
    lock = acquire(run_dir, log=messages.append)
    assert messages and "took over" in messages[0] and f"pid {holder.pid}" in messages[0]
    lock.release()
    assert not (run_dir / ".lock").exists()


def test_stale_or_garbled_locks_are_taken_over(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(done.stdout)
    (tmp_path / ".lock").write_text(
        json.dumps(
            {
                "pid": dead,
                "host": __import__("socket").gethostname(),
                "start": None,
                "since": time.time(),
                "argv": ["x"],
            }
        )
    )
    messages: list[str] = []
    acquire(tmp_path, log=messages.append).release()
    assert "no longer running" in messages[0]
    (tmp_path / ".lock").write_text("{garbled")
    acquire(tmp_path, log=messages.append).release()
    assert "an unreadable lock file" in messages[1]


def test_a_lock_from_another_host_is_not_taken_over(tmp_path):
    (tmp_path / ".lock").write_text(
        json.dumps({"pid": 1, "host": "elsewhere", "start": None, "since": time.time(), "argv": ["fit"]})
    )
    with pytest.raises(RunDirectoryInUse, match=r"locked by a run on another host \(pid 1 on host elsewhere.*delete"):
        acquire(tmp_path)
