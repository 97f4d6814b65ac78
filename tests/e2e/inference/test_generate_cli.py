"""`lightning_cqk generate`: the checkpoint's tokenizer, text streamed as produced, the same tokens as `generate`,
clear errors for bad checkpoints and prompts past block_size (their suggested fix works), one real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_cqk.data.tokenizers import get_tokenizer
from lightning_cqk.inference import generate_all
from lightning_cqk.inference.generate_command import generate_command
from lightning_cqk.inference.text import TextStream
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A saved `LitLM` (bytes tokenizer, block 32) in the layout `lightning_cqk fit` writes."""
    torch.manual_seed(0)
    lit = LitLM(ModelConfig(preset="tiny", vocab_size=257, block_size=32, n_layer=1, n_embd=32, n_head=2))
    path = tmp_path_factory.mktemp("ckpt") / "last.ckpt"
    torch.save(
        {
            "state_dict": lit.state_dict(),
            "hyper_parameters": dict(lit.hparams),
            "datamodule_hyper_parameters": {"tokenizer": "bytes", "data_dir": None},
        },
        path,
    )
    return path


class Recorder:
    """A stdout that remembers each write (to see the text arrive piece by piece)."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_streams_the_greedy_continuation_of_generate(checkpoint, monkeypatch):
    out = Recorder()
    monkeypatch.setattr(sys, "stdout", out)
    generate_command(
        ["--checkpoint", str(checkpoint), "--prompt", "ab", "--max_new_tokens", "12", "--temperature", "0"]
    )
    from lightning_cqk.inference.pretrained import load_pretrained

    model = load_pretrained(checkpoint).model
    tok = get_tokenizer("bytes")
    expected = tok.decode(generate_all(model, [[tok.eos_id, *tok.encode("ab")]], 12, temperature=0)[0])
    assert "".join(out.writes) == "ab" + expected + "\n"
    assert len(out.writes) >= 4  # the prompt, then the continuation in pieces as tokens arrive, then the newline


def test_seeded_samples_repeat_and_several_prompts_are_headed(checkpoint, capsys, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("xy\n\nzw\n")
    args = ["--checkpoint", str(checkpoint), "--prompt", "ab", "--prompt_file", str(prompts), "--max_new_tokens", "6"]
    args += ["--top_k", "20", "--seed", "3", "--num_samples", "2", "--batch_size", "3"]
    generate_command(args)
    first = capsys.readouterr()
    generate_command(args)
    assert capsys.readouterr().out == first.out
    heads = [line for line in first.out.splitlines() if line.startswith("=== sample")]
    assert heads == [f"=== sample {i}/6 (prompt {(i + 1) // 2}) ===" for i in range(1, 7)]
    assert first.err.count("ended by length") == 6


def test_past_block_size_the_suggested_fix_works(checkpoint, capsys):
    base = ["--checkpoint", str(checkpoint), "--prompt", "0123456789", "--temperature", "0"]
    fix = "longest prompt of 11 tokens .*end-of-document.* pass --max_new_tokens 22, or --context_policy slide"
    with pytest.raises(SystemExit, match=fix):
        generate_command([*base, "--prompt", "short", "--max_new_tokens", "40"])  # 1 EOS + 10 bytes; block 32
    assert capsys.readouterr().out == ""  # refused before anything was printed (the short prompt neither)
    generate_command([*base, "--max_new_tokens", "22"])
    generate_command([*base, "--max_new_tokens", "40", "--context_policy", "slide"])
    assert capsys.readouterr().err.count("ended by length") == 2


def test_missing_and_invalid_checkpoints_are_clear_errors(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        generate_command(["--checkpoint", str(tmp_path / "nope.ckpt"), "--prompt", "a"])
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(SystemExit, match="garbage.ckpt cannot be loaded: it is not a checkpoint"):
        generate_command(["--checkpoint", str(garbage), "--prompt", "a"])
    other = tmp_path / "other.ckpt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(SystemExit, match="not a lightning_cqk language-model checkpoint"):
        generate_command(["--checkpoint", str(other), "--prompt", "a"])
    with pytest.raises(SystemExit, match="no prompt"):
        generate_command(["--checkpoint", str(other)])


def test_text_stream_never_emits_half_a_character():
    tok = get_tokenizer("bytes")
    text = "é€ a 😀!"
    stream, pieces = TextStream(tok.decode), []
    for i in tok.encode(text):
        pieces.append(stream.push([i]))
    pieces.append(stream.flush())
    assert "".join(pieces) == text and "\ufffd" not in "".join(pieces[:-1])
    cut = TextStream(tok.decode)
    assert cut.push(tok.encode("a€")[:-1]) == "a"
    assert cut.flush() == "\ufffd"  # the stream ended inside a character


def test_the_real_command_line(checkpoint):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    args = ["--checkpoint", str(checkpoint), "--prompt", "hello", "--max_new_tokens", "5", "--temperature", "0"]
    out = subprocess.run(
        [sys.executable, "-m", "lightning_cqk", "generate", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("hello") and "[sample 1: 5 tokens, ended by length" in out.stderr


def test_sampling_flags_out_of_range_say_a_fix_that_can_be_typed(tmp_path):
    """`--top_k 0` cannot be fixed by passing "None" (what the library's message says): the command says to leave
    the flag out. Checked before the checkpoint is read."""
    ckpt = str(tmp_path / "never-read.ckpt")
    with pytest.raises(SystemExit, match=r"--top_k must be >= 1 .*leave --top_k out") as err:
        generate_command(["--checkpoint", ckpt, "--prompt", "a", "--top_k", "0"])
    assert "None" not in str(err.value)
    with pytest.raises(SystemExit, match=r"--top_p must be in \(0, 1\]") as err:
        generate_command(["--checkpoint", ckpt, "--prompt", "a", "--top_p", "0"])
    assert "None" not in str(err.value)
