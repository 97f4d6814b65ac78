"""Zero/few-shot multiple-choice scoring: the jsonl format, log-likelihoods against a token-by-token reference, and
a tiny task that a briefly trained LM gets right."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from downstream_helpers import train_lm

from lightning_cqk.cli import main
from lightning_cqk.downstream.multiple_choice import (
    MCExample,
    build_prompt,
    choice_logprobs,
    evaluate_mc,
    load_mc_jsonl,
)
from lightning_cqk.inference.pretrained import load_pretrained


def _reference_logprob(model, tokenizer, prompt: str, continuation: str, block_size: int) -> float:
    """Token by token, one forward per scored token, inside the harnesses' window: the last block_size + 1 tokens of
    EOS + prompt + continuation (a long prompt loses its start; every scored token reads the window up to itself)."""
    cont = tokenizer.encode(continuation)
    window = ([tokenizer.eos_id] + tokenizer.encode(prompt) + cont)[-(block_size + 1) :]
    total = 0.0
    for p in range(len(window) - len(cont), len(window)):
        with torch.no_grad():
            total += float(F.log_softmax(model(torch.tensor([window[:p]]))[0, -1].double(), dim=-1)[window[p]])
    return total


def test_logprobs_equal_a_token_by_token_reference(lm_checkpoint: Path):
    pretrained = load_pretrained(lm_checkpoint)
    model, tok, block = pretrained.model, pretrained.tokenizer, pretrained.config.block_size
    for prompt in ("the cat sat on the", "x" * 200):  # the second needs left truncation (block_size 64)
        choices = [" mat", " dog", " a much longer answer"]
        got = choice_logprobs(model, tok, prompt, choices, block)
        want = [_reference_logprob(model, tok, prompt, c, block) for c in choices]
        assert got == pytest.approx(want, rel=1e-4, abs=1e-4)
    with pytest.raises(ValueError, match="cannot be scored with block_size 64"):
        choice_logprobs(model, tok, "q", ["y" * 65], block)


def test_jsonl_format_checks(tmp_path: Path):
    path = tmp_path / "task.jsonl"
    path.write_text(json.dumps({"context": "2 + 2 =", "choices": ["4", "5"], "label": 0, "id": "q1"}) + "\n\n")
    assert load_mc_jsonl(path) == [MCExample("2 + 2 =", ("4", "5"), 0, "q1")]
    bad = {
        '{"context": "c", "choices": ["a", "b"]}': "needs the fields",
        '{"context": "c", "choices": ["a"], "label": 0}': "at least two",
        '{"context": "c", "choices": ["a", "b"], "label": 2}': r"label must be an index into choices \(0..1\)",
        '{"context": "c", "choices": ["a", ""], "label": 0}': "non-empty",
        "{oops": "not JSON",
    }
    for line, message in bad.items():
        path.write_text(line + "\n")
        with pytest.raises(ValueError, match=f"task.jsonl:1: .*{message}"):
            load_mc_jsonl(path)


def test_fewshot_prompt_and_sampling():
    shots = [MCExample("1 + 1 =", ("2", "3"), 0), MCExample("Sky is", ("green", "blue"), 1)]
    assert build_prompt(MCExample("Q:", ("a", "b"), 0), shots) == "1 + 1 = 2\n\nSky is blue\n\nQ:"
    assert build_prompt(MCExample("Q:", ("a", "b"), 0), [], delimiter="|") == "Q:"


class _Recorder(torch.nn.Module):
    """A stand-in LM (uniform logits) that records what it reads."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.seen: list[str] = []

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self.seen.append(bytes(int(i) for i in idx[0] if int(i) < 256).decode())
        return torch.zeros(*idx.shape, 257) + self.w


def test_questions_whose_prompt_loses_its_start_are_counted():
    from lightning_cqk.data.tokenizers import get_tokenizer

    examples = [MCExample("ab", ("c", "d"), 0), MCExample("x" * 20, ("c", "d"), 0), MCExample("abcd", ("ef", "g"), 0)]
    # block 8: EOS + "ab" + " c" reads 4 tokens; EOS + "abcd" + " ef" reads 7; EOS + 20 x + " c" needs 22
    result = evaluate_mc(_Recorder(), get_tokenizer("bytes"), examples, 8)
    assert result["truncated"] == 1
    assert evaluate_mc(_Recorder(), get_tokenizer("bytes"), examples, 64)["truncated"] == 0


def test_shots_never_include_the_question_and_are_seeded():
    from lightning_cqk.data.tokenizers import get_tokenizer

    examples = [MCExample(f"q{i}", (f"a{i}", "z"), 0) for i in range(6)]
    model = _Recorder()
    result = evaluate_mc(model, get_tokenizer("bytes"), examples, 256, num_fewshot=3, seed=7)
    assert result["n"] == 6 and result["num_fewshot"] == 3
    for i, seen in enumerate(model.seen):  # one forward per question
        shots = seen.split("\n\n")[:-1]
        assert len(shots) == 3 and f"q{i} a{i}" not in shots and seen.split("\n\n")[-1].startswith(f"q{i}")
    again = _Recorder()
    evaluate_mc(again, get_tokenizer("bytes"), examples, 256, num_fewshot=3, seed=7)
    assert again.seen == model.seen
    with pytest.raises(ValueError, match=r"num_fewshot must lie in 0..5"):
        evaluate_mc(model, get_tokenizer("bytes"), examples, 256, num_fewshot=6)


def test_tiny_task_is_solved_by_a_trained_lm(tmp_path: Path):
    """After 40 steps on sentences of 13 words, the LM prefers a known word over letters it never saw in that order."""
    ckpt = train_lm(tmp_path / "lm", steps=40, extra=["--model.optim.lr=1e-2"])
    rng = random.Random(0)
    words = ["good", "great", "fine", "nice", "bad", "awful", "poor", "sad", "the", "cat", "sat", "on", "mat"]
    rows = []
    for i in range(12):
        context = " ".join(rng.choice(words) for _ in range(6))
        right = rng.choice(words)
        wrong = "".join(rng.choice("qxzjkvw") for _ in right)
        choices = [right, wrong] if i % 2 == 0 else [wrong, right]
        rows.append({"context": context, "choices": choices, "label": i % 2})
    task = tmp_path / "toy.jsonl"
    task.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "mc.json"
    main(["mc-eval", f"--checkpoint={ckpt}", f"--tasks=[{task}]", "--num_fewshot=2", f"--output={out}"])
    result = json.loads(out.read_text())["tasks"]["toy"]
    assert result["n"] == 12 and result["acc"] == 1.0 and result["acc_norm"] == 1.0


def test_mc_eval_reads_the_window_of_a_fixed_reference_stream(tmp_path: Path):
    """rnd_emb_qk with a stream of 12 < block_size 16 has 12 positions: mc-eval cuts prompts to that (it failed in
    the forward) and counts the truncation."""
    from lightning_cqk.downstream.multiple_choice import mc_eval
    from lightning_cqk.model import GPT
    from lightning_cqk.model_config import ModelConfig

    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=257, n_layer=1, n_embd=32, n_head=4, mlp_hidden=64, block_size=16, attention="rnd_emb_qk",
        attention_options={"length": 12},
    )  # fmt: skip
    model = GPT(config)
    ckpt = tmp_path / "lm.ckpt"
    torch.save(
        {
            "hyper_parameters": {"config": config.to_dict()},
            "datamodule_hyper_parameters": {"tokenizer": "bytes"},
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        },
        ckpt,
    )
    task = tmp_path / "task.jsonl"
    task.write_text(json.dumps({"context": "a context of more than twelve bytes", "choices": ["a", "b"], "label": 0}))
    result = mc_eval(str(ckpt), [str(task)])
    assert result["tasks"]["task"]["truncated"] == 1
