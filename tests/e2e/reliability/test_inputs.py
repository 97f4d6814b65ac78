"""Issue 13, classes 7a, 9 and 10 (inputs): nothing asked for is silently ignored, nothing read is silently left out.

7a: a data_dir holding shards of another source/tokenizer/settings is refused, naming both and fixes that work when
    pasted; a rebuild deletes only what prepare wrote.
9:  a corpus whose files name their splits refuses files that name none (unless told what to do), counts everything
    it leaves out (output and manifest), and drops training copies of validation documents; a source whose bytes
    are mostly in unreadable files is refused.
10: lone surrogate escapes are replaced, counted and located; meaningless optimiser/trainer numbers are refused; a
    zip or other file that is not a checkpoint is named as such; a hand-edited manifest tokenizer is caught without
    the vocabulary at hand.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
import tiktoken
import torch
from tiny_run import tiny_args, tiny_trainer

from lightning_cqk.callbacks import AtomicCheckpointIO
from lightning_cqk.checkpoint.reading import CorruptCheckpointError, checkpoint_problem
from lightning_cqk.cli import main
from lightning_cqk.cli.trainer import CQKCLI
from lightning_cqk.data import Manifest, TokenDataModule, prepare
from lightning_cqk.data import tokenizers as tokenizers_module
from lightning_cqk.data.corpora import resolve_corpus
from lightning_cqk.data.mixture import MixtureDataModule
from lightning_cqk.data.tokenizers import GPT2_BPE_ENV
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM
from lightning_cqk.optim import OptimConfig
from lightning_cqk.optim.config import check_trainer_numbers

REPO = Path(__file__).resolve().parents[3]
SHARED = REPO.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory) -> tuple[Path, Path, Path]:
    """Two different JSON-lines corpora and shards prepared from the first."""
    root = tmp_path_factory.mktemp("inputs")
    a = write_jsonl(
        root / "a" / "a.jsonl", [f"Corpus A document {i}. " + "alpha beta " * (3 + i % 5) for i in range(60)]
    )
    b = write_jsonl(
        root / "b" / "b.jsonl", [f"Corpus B document {i}. " + "gamma delta " * (3 + i % 5) for i in range(60)]
    )
    prepare(str(a), str(root / "shards"), val_fraction=0.2)
    return a, b, root / "shards"


def cli_args(shards: Path, runs: Path, *extra: str) -> list[str]:
    """The tiny run (tests/tiny_run.py) of 2 steps reading `shards`, then `extra`."""
    return tiny_args(shards, runs, "--trainer.max_steps=2", "--trainer.limit_val_batches=1", *extra)


# ------------------------------------------------------------------------------------------------- class 7a
def test_shards_of_another_source_are_refused_naming_both_and_the_fixes_work(two_sources, tmp_path, capsys):
    a, b, shards = two_sources
    shards = Path(shutil.copytree(shards, tmp_path / "shards"))
    stamp = (shards / "manifest.json").stat().st_mtime_ns
    dm = TokenDataModule(data_dir=str(shards), source=str(b), seq_len=8, batch_size=2, val_fraction=0.2)
    with pytest.raises(ValueError, match="data.source does not match the shards") as err:
        dm.prepare_data()
    message = str(err.value)
    assert str(a.parent) in message and str(b) in message, "names what the shards hold and what was asked"
    assert "--data.data_dir" in message and "--data.source null" in message and "--overwrite true" in message
    assert (shards / "manifest.json").stat().st_mtime_ns == stamp, "nothing rebuilt or deleted"

    # Each setting that changes the shards is compared too, and `source: null` takes the shards as they are.
    for changed in (dict(source=str(a), val_fraction=0.3), dict(source=str(a), documents="line", val_fraction=0.2)):
        with pytest.raises(ValueError, match="val_fraction: prepared 0.2, asked 0.3|documents_mode"):
            TokenDataModule(data_dir=str(shards), seq_len=8, **changed).prepare_data()
    TokenDataModule(data_dir=str(shards), source=str(a), val_fraction=0.2).prepare_data()  # the same: reused
    TokenDataModule(data_dir=str(shards), source=None).prepare_data()
    appended = tmp_path / "a-appended.jsonl"
    shutil.copy(a, appended)
    pre = TokenDataModule(data_dir=str(tmp_path / "s2"), source=str(appended), val_fraction=0.2)
    pre.prepare_data()
    write_jsonl(tmp_path / "extra.jsonl", ["one more"])
    appended.write_text(appended.read_text() + (tmp_path / "extra.jsonl").read_text())
    with pytest.raises(ValueError, match="1 file\\(s\\) changed since"):
        pre.prepare_data()

    # The pasted in-place rebuild works (through the real prepare CLI), and then the run is accepted.
    command = message.split("only prepare's own files are replaced): ")[1]
    argv = shlex.split(command)
    assert argv[:2] == ["lightning_cqk", "prepare"]
    main(argv[1:])
    assert Manifest.load(shards).files[0]["path"] == str(b.resolve())
    dm.prepare_data()  # now matches

    # The suggested new data_dir is free, and the CLI accepts every flag the message names.
    new_dir = message.split("--data.data_dir ")[1].split(";")[0]
    assert not Path(new_dir).exists()
    capsys.readouterr()
    CQKCLI(args=cli_args(shards, tmp_path / "runs", f"--data.data_dir={new_dir}", "--data.source=null"), run=False)


def test_the_cli_and_a_mixture_refuse_a_changed_source(two_sources, tmp_path):
    a, b, shards = two_sources
    with pytest.raises(ValueError, match=f"data.source does not match the shards in data.data_dir={shards}"):
        main(["fit", *cli_args(shards, tmp_path / "runs", f"--data.source={b}", "--data.val_fraction=0.2")])
    assert not list((tmp_path / "runs").rglob("*.ckpt"))
    mixture = MixtureDataModule(
        components=[{"corpus": "text", "data_dir": str(shards), "source": str(b)}], tokenizer="bytes", seq_len=8
    )
    with pytest.raises(ValueError, match="corpus 'text' from"):
        mixture.prepare_data()


def test_a_rebuild_never_deletes_what_prepare_did_not_write(two_sources, tmp_path):
    a, _, _ = two_sources
    out = tmp_path / "out"
    mine = out / "train" / "my_notes.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("a user's own file")
    for overwrite in (False, True):
        with pytest.raises(ValueError, match=r"out/train is not a token-shard folder written by lightning_cqk"):
            prepare(str(a), str(out), val_fraction=0.2, overwrite=overwrite)
    assert mine.read_text() == "a user's own file" and not Manifest.exists(out)


# ------------------------------------------------------------------------------------------------- class 9
def corpus_folder(root: Path) -> Path:
    write_jsonl(root / "train.jsonl", [f"train abstract {i} " + "cells " * 8 for i in range(20)] + ["shared text x"])
    write_jsonl(root / "valid.jsonl", [f"valid abstract {i} " + "genes " * 8 for i in range(6)] + ["shared text x"])
    write_jsonl(root / "test.jsonl", [f"test abstract {i}" for i in range(4)])
    write_jsonl(root / "more" / "extra_abstracts.jsonl", [f"extra abstract {i} " + "mice " * 8 for i in range(30)])
    (root / "README.md").write_text("About this corpus.")
    return root


def test_files_that_name_no_split_are_refused_counted_or_used_as_told(tmp_path, capsys):
    root = corpus_folder(tmp_path / "pm")
    with pytest.raises(ValueError, match=r"(?s)1 file\(s\) name none.*extra_abstracts\.jsonl \(30 documents") as err:
        prepare(str(root), str(tmp_path / "o0"), corpus="pubmed")
    assert "test.jsonl (4 documents" in str(err.value) and "--other_files" in str(err.value)
    assert not Manifest.exists(tmp_path / "o0")

    capsys.readouterr()
    left = prepare(str(root), str(tmp_path / "o1"), corpus="pubmed", other_files="leave_out")
    out = capsys.readouterr().out
    assert "LEFT OUT of corpus 'pubmed'" in out and "extra_abstracts.jsonl (30 documents" in out
    reasons = {Path(e["path"]).name: (e["reason"], e["documents"]) for e in left.left_out}
    assert reasons["extra_abstracts.jsonl"] == ("names no split (other_files=leave_out)", 30)
    assert reasons["test.jsonl"] == ("test split (kept unseen)", 4) and "README.md" in reasons
    # The training copy of a validation document is left out and counted (val_overlap="drop").
    assert (left.splits["train"].documents, left.splits["val"].documents) == (20, 7)
    assert left.splits["train"].dropped_val_copies == 1 and "train.jsonl:21" in left.splits["train"].first_val_copy
    assert "1 training documents are identical to validation documents" in out
    assert json.loads((tmp_path / "o1" / "manifest.json").read_text())["left_out"] == left.left_out

    kept = prepare(str(root), str(tmp_path / "o2"), corpus="pubmed", other_files="train", val_overlap="keep")
    assert kept.splits["train"].documents == 51 and kept.val_overlap == "keep"
    hashed = prepare(str(root), str(tmp_path / "o3"), corpus="pubmed", other_files="hash")
    assert hashed.splits["train"].documents + hashed.splits["val"].documents == 21 + 7 + 30, "every non-test document"
    assert hashed.split_rule.startswith("int(blake2b") and Path(hashed.left_out[-1]["path"]).name == "test.jsonl"
    # The CLI flags the message names are the ones the CLIs accept.
    main(
        ["prepare", "--source", str(root), "--output_dir", str(tmp_path / "o1"), "--corpus", "pubmed"]
        + ["--other_files", "leave_out"]
    )
    CQKCLI(
        args=cli_args(tmp_path / "o1", tmp_path / "runs", "--data.other_files=leave_out", "--data.val_overlap=keep"),
        run=False,
    )


def test_the_shared_pubmed_folder_says_what_it_leaves_out():
    if not (SHARED / "pubmed" / "combined" / "pubmed_abstracts.jsonl").is_file():
        pytest.skip(f"shared data folder {SHARED} is absent")
    with pytest.raises(ValueError, match=r"pubmed_abstracts\.jsonl \(4,352 documents") as err:
        resolve_corpus("pubmed", str(SHARED / "pubmed"))
    assert "CDR_TrainingSet.PubTator.txt (1,000 documents" in str(err.value)


def test_a_source_mostly_in_unreadable_files_is_refused_a_few_are_counted(tmp_path, capsys):
    src = tmp_path / "src"
    write_jsonl(src / "docs.jsonl", [f"document {i} " * 5 for i in range(20)])
    (src / "archive.tar.xz").write_bytes(b"\xfd7zXZ" + bytes(5000))
    with pytest.raises(ValueError, match=r"Most of the source is in files prepare cannot read.*archive\.tar\.xz"):
        prepare(str(src), str(tmp_path / "o"), val_fraction=0.2)
    (src / "archive.tar.xz").write_bytes(b"\xfd7zXZ" + bytes(10))
    manifest = prepare(str(src), str(tmp_path / "o"), val_fraction=0.3)
    assert "LEFT OUT: 1 file(s) of unsupported type" in capsys.readouterr().out
    assert manifest.left_out[0]["reason"].startswith("unsupported file type (.tar.xz)")


# ------------------------------------------------------------------------------------------------- class 10
def test_a_lone_surrogate_is_replaced_counted_and_located(tmp_path, capsys):
    src = tmp_path / "s.jsonl"
    lines = [json.dumps({"text": f"fine document {i} " * 4}) for i in range(30)]
    lines[6] = '{"text": "broken \\ud800 escape, and a pair \\ud83d\\ude00 that is fine"}'
    lines[8], lines[9] = '{"text": null}', '{"text": "   "}'  # skipped, and counted once (not per hash pass)
    src.write_text("\n".join(lines) + "\n")
    manifest = prepare(str(src), str(tmp_path / "o"), val_fraction=0.3)
    stats = [manifest.splits[s] for s in ("train", "val")]
    assert sum(s.replaced_surrogates for s in stats) == 1
    assert any(s.first_replaced == f"{src}:7" for s in stats)
    assert sum(s.documents for s in stats) == 28 and sum(s.skipped_blank for s in stats) == 2
    out = capsys.readouterr().out
    assert (
        "1 lone surrogate escapes in JSON text" in out
        and f"2 records or files with blank or null text (first: {src}:9" in out
    )


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (dict(weight_decay=-0.1), r"optim\.weight_decay=-0\.1 is not allowed: .*>= 0.*--model\.optim\.weight_decay 0"),
        (dict(lr=0.0), r"optim\.lr=0\.0 is not allowed: .*positive and finite"),
        (dict(lr=float("nan")), r"optim\.lr=nan"),
        (dict(betas=(0.9, 1.0)), r"optim\.betas=\[0\.9, 1\.0\] is not allowed: .*\[0, 1\)"),
        (dict(betas=(-0.1, 0.9)), r"optim\.betas"),
        (dict(eps=0.0), r"optim\.eps=0\.0"),
        (dict(warmup_steps=-1), r"optim\.warmup_steps=-1"),
        (dict(min_lr_ratio=1.5), r"optim\.min_lr_ratio=1\.5"),
        (dict(decay_steps=0), r"optim\.decay_steps=0"),
        (dict(warmup_steps=200, decay_steps=100), r"optim\.warmup_steps=200 .*longer than optim\.decay_steps=100"),
        (dict(logit_control={"method": "quack", "tau": float("inf")}), r"tau must be positive and finite"),
    ],
)
def test_meaningless_optimiser_numbers_are_refused(setting, message):
    with pytest.raises(ValueError, match=message):
        OptimConfig(**setting)


def test_negative_gradient_clip_is_refused_and_a_long_warmup_warned(tmp_path):
    check_trainer_numbers(tiny_trainer(gradient_clip_val=0))
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match=r"trainer\.gradient_clip_val=.* is not allowed.*--trainer\.gradient_clip"):
            check_trainer_numbers(tiny_trainer(gradient_clip_val=bad))
    module = LitLM(
        ModelConfig(vocab_size=32, n_layer=1, n_head=2, n_embd=16, block_size=8), OptimConfig(warmup_steps=5)
    )
    data = torch.utils.data.DataLoader(torch.randint(0, 32, (8, 9)), batch_size=4)
    kw = dict(enable_checkpointing=False)
    with pytest.raises(ValueError, match=r"trainer\.gradient_clip_val=-0\.5"):
        tiny_trainer(max_steps=2, gradient_clip_val=-0.5, **kw).fit(module, data)
    assert module.global_step == 0
    with pytest.warns(UserWarning, match=r"warmup_steps=5 is at least the schedule's 2 steps"):
        tiny_trainer(max_steps=2, **kw).fit(module, data)
    with pytest.raises(ValueError, match=r"optim\.weight_decay=-1\.0 is not allowed"):
        main(["fit", *cli_args(tmp_path, tmp_path / "runs", "--data.source=null"), "--model.optim.weight_decay=-1"])


def test_a_file_that_is_not_a_checkpoint_is_named_as_such(tmp_path):
    notes = tmp_path / "notes.zip"
    with zipfile.ZipFile(notes, "w") as archive:
        archive.writestr("readme.txt", "not a model")
    yaml = tmp_path / "config.ckpt"
    yaml.write_text("model:\n  lr: 1\n")
    good = tmp_path / "good.ckpt"
    torch.save({"state_dict": {"w": torch.ones(2)}}, good)
    assert checkpoint_problem(good) is None
    assert "zip archive but not a checkpoint" in checkpoint_problem(notes) and "readme.txt" in checkpoint_problem(notes)
    assert "not a checkpoint" in checkpoint_problem(yaml) and "b'mode'" in checkpoint_problem(yaml)
    for path in (notes, yaml):
        with pytest.raises(CorruptCheckpointError, match=rf"Checkpoint {path} cannot be loaded: .*not a checkpoint"):
            AtomicCheckpointIO().load_checkpoint(path)


def test_a_hand_edited_manifest_tokenizer_is_refused_without_the_vocabulary(two_sources, tmp_path, monkeypatch):
    _, _, shards = two_sources

    def offline(name):
        raise ConnectionError("network is unreachable")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    monkeypatch.delenv(GPT2_BPE_ENV, raising=False)
    edited = Path(shutil.copytree(shards, tmp_path / "edited"))
    raw = json.loads((edited / "manifest.json").read_text())
    (edited / "manifest.json").write_text(
        json.dumps({**raw, "tokenizer": "gpt2", "vocab_size": 50257, "eos_id": 50256})
    )
    dm = TokenDataModule(data_dir=str(edited), source=None, tokenizer="gpt2", seq_len=8, batch_size=2)
    with pytest.raises(ValueError, match="different 'gpt2' vocabulary .*edited"):
        dm.setup("fit")
    # Edited consistently (a real GPT-2 fingerprint copied in): the shards' own end-of-document id gives it away.
    fake = {**raw, "tokenizer": "gpt2", "vocab_size": 50257, "eos_id": 50256}
    fake["tokenizer_fingerprint"] = tokenizers_module.GPT2_FINGERPRINT
    (edited / "manifest.json").write_text(json.dumps(fake))
    with pytest.raises(ValueError, match=r"end with token id 256, not 'gpt2''s end-of-document id 50256"):
        dm.setup("fit")
    # A tokenizer with no fixed fingerprint whose vocabulary is not at hand: refused, saying how to provide it.
    monkeypatch.setattr(tokenizers_module.GPT2Tokenizer, "known_fingerprint", None)
    with pytest.raises(ValueError, match=r"Cannot verify .*--data\.bpe_file PATH"):
        dm.setup("fit")
    vocab = SHARED / "gpt2_bpe" / "gpt2.tiktoken"
    CQKCLI(args=cli_args(edited, tmp_path / "runs", "--data.source=null", f"--data.bpe_file={vocab}"), run=False)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (dict(num_workers=-1), r"data\.num_workers=-1 must be an integer >= 0"),
        (dict(prepare_workers=0), r"data\.prepare_workers=0"),
        (dict(val_fraction=1.0), r"data\.val_fraction=1\.0 must be in \[0, 1\)"),
        (dict(val_fraction=float("nan")), r"data\.val_fraction=nan"),
        (dict(max_documents=0), r"data\.max_documents=0"),
        (dict(val_seq_len=0), r"data\.val_seq_len=0"),
    ],
)
def test_meaningless_data_numbers_are_refused(setting, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        TokenDataModule(data_dir=str(tmp_path), **setting)


def test_mixture_weights_must_be_finite(tmp_path):
    with pytest.raises(ValueError, match="positive and finite"):
        MixtureDataModule(components=[{"corpus": "text", "data_dir": str(tmp_path), "weight": float("inf")}])
