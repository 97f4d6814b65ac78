"""Zero- and few-shot multiple-choice evaluation by log-likelihood, as evaluation harnesses do it.

Task format: JSON lines, one question per line::

    {"context": "The capital of France is", "choices": ["Paris", "Rome", "Madrid"], "label": 0}

(optional ``"id"``; other fields are ignored). ARC, PIQA, HellaSwag, ... files a user has become this format with a
one-line conversion (e.g. HellaSwag: context = ctx, choices = endings, label = int(label)).

Scoring. For each choice the model reads ``EOS + prompt + delimiter + choice`` and the choice's tokens are scored:
``log p(choice | prompt) = sum of log p(token_i | everything before it)``. The leading EOS is the document boundary the
LM saw before every document in pre-training. Two accuracies are reported, both as harnesses define them:

* ``acc``: the choice with the highest total log-likelihood is the prediction;
* ``acc_norm``: the highest log-likelihood per UTF-8 byte of the choice text (removes the bias towards short choices;
  harnesses divide by characters, identical for ASCII).

Ties go to the first choice (``argmax``). Few-shot (``num_fewshot`` = k): the prompt is k solved examples
(``context + delimiter + correct choice``), each followed by ``shot_separator``, then the question's context. The
shots are drawn with a fixed seed, per question, from ``fewshot_file`` or else from the other questions of the same
file (never the question itself). When a sequence is longer than the model's ``block_size``, the prompt loses tokens
from its start (counted per task: ``truncated``); a choice that alone does not fit is an error.

Tokenisation: prompt and ``delimiter + choice`` are tokenised separately and concatenated, so the scored tokens are
exactly the choice's (with a BPE tokenizer the split at the boundary can differ from tokenising the whole string).

Relation to ``lightning_cqk eval`` (lm-evaluation-harness, `lightning_cqk.evaluation`): both score with
`lightning_cqk.evaluation.scoring.score_continuations`. Zero-shot, on a context without trailing whitespace and with
a tokenizer that splits the boundary the same way, mc-eval's log-likelihoods and accuracies equal ``eval
--prefix_eos``'s (``acc_norm`` here = lm-eval's ``acc_bytes``); lm-eval's default puts no EOS before a non-empty
context, moves the context's trailing whitespace into the continuation and normalises ``acc_norm`` by characters
(docs/evaluation.md; tested in tests/e2e/evaluation/test_harness.py).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lightning_cqk.data.tokenizers import Tokenizer
from lightning_cqk.evaluation.scoring import score_continuations
from lightning_cqk.files.atomic import write_json_atomically


@dataclass(frozen=True)
class MCExample:
    """One multiple-choice question."""

    context: str
    choices: tuple[str, ...]
    label: int
    id: str = ""


def load_mc_jsonl(path: str | Path) -> list[MCExample]:
    """Read a multiple-choice jsonl file, checking every line (the error names the line and what is wrong)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Multiple-choice task file {path} does not exist.")
    examples = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not JSON ({err.msg}).") from None
        if not isinstance(row, dict) or not {"context", "choices", "label"} <= row.keys():
            raise ValueError(f"{where}: needs the fields context, choices, label; got {sorted(row)}.")
        choices, label = row["choices"], row["label"]
        if not isinstance(row["context"], str) or not isinstance(choices, list) or len(choices) < 2:
            raise ValueError(f"{where}: context must be text and choices a list of at least two texts.")
        if not all(isinstance(c, str) and c for c in choices):
            raise ValueError(f"{where}: every choice must be non-empty text.")
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(choices):
            raise ValueError(f"{where}: label must be an index into choices (0..{len(choices) - 1}), got {label!r}.")
        examples.append(MCExample(row["context"], tuple(choices), label, str(row.get("id", n))))
    if not examples:
        raise ValueError(f"{path} holds no questions.")
    return examples


def build_prompt(example: MCExample, shots: list[MCExample], delimiter: str = " ", shot_separator: str = "\n\n") -> str:
    """The text before a choice: the solved shots, then the question's context."""
    solved = "".join(f"{s.context}{delimiter}{s.choices[s.label]}{shot_separator}" for s in shots)
    return solved + example.context


def choice_logprobs(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    prompt: str,
    continuations: list[str],
    block_size: int,
) -> list[float]:
    """Total log-likelihood of each continuation after ``EOS + prompt`` (one batched forward).

    The scoring itself is `lightning_cqk.evaluation.scoring.score_continuations`, the one `lightning_cqk eval`'s
    lm-eval adapter uses; this function fixes mc-eval's conventions (the EOS prefix, separate tokenisation).
    """
    prompt_ids = [tokenizer.eos_id] + tokenizer.encode(prompt)
    requests = []
    for text in continuations:
        cont = tokenizer.encode(text)
        if not cont or len(cont) > block_size:
            raise ValueError(
                f"A choice of {len(cont)} tokens cannot be scored with block_size {block_size} (1..block_size needed)."
            )
        requests.append((prompt_ids, cont))
    scored = score_continuations(model, requests, block_size, batch_size=len(requests))
    return [logprob for logprob, _ in scored]


def evaluate_mc(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    examples: list[MCExample],
    block_size: int,
    num_fewshot: int = 0,
    fewshot_pool: list[MCExample] | None = None,
    seed: int = 1234,
    delimiter: str = " ",
    shot_separator: str = "\n\n",
) -> dict[str, Any]:
    """Score every question; returns ``acc``, ``acc_norm``, ``n``, ``truncated`` (questions whose prompt lost tokens
    from its start to fit ``block_size``) and per-question predictions.

    Args:
        model: a GPT (token ids (B, T) -> logits (B, T, vocab)), in eval mode.
        tokenizer: the tokenizer it was trained with.
        examples: the questions.
        block_size: the model's context length.
        num_fewshot: solved examples before each question.
        fewshot_pool: where shots come from (default: the other questions of ``examples``).
        seed: seed of the shot sampling.
        delimiter: text between a context and a choice.
        shot_separator: text after each solved shot.
    """
    pool = fewshot_pool if fewshot_pool is not None else examples
    available = len(pool) - (0 if fewshot_pool is not None else 1)
    if num_fewshot < 0 or num_fewshot > available:
        raise ValueError(f"num_fewshot must lie in 0..{available} (the few-shot pool's size), got {num_fewshot}.")
    rng = random.Random(seed)
    correct = correct_norm = truncated = 0
    records = []
    for i, example in enumerate(examples):
        shots = []
        if num_fewshot:  # k + 1 draws so that dropping the question itself (same pool) still leaves k
            drawn = rng.sample(range(len(pool)), min(len(pool), num_fewshot + 1))
            shots = [pool[j] for j in drawn if fewshot_pool is not None or j != i][:num_fewshot]
        prompt = build_prompt(example, shots, delimiter, shot_separator)
        scores = choice_logprobs(model, tokenizer, prompt, [delimiter + c for c in example.choices], block_size)
        longest = max(len(tokenizer.encode(delimiter + c)) for c in example.choices)
        truncated += 1 + len(tokenizer.encode(prompt)) + longest - 1 > block_size  # EOS + prompt + choice, less 1
        norm = [s / max(1, len(c.encode("utf-8"))) for s, c in zip(scores, example.choices)]
        pred, pred_norm = max(range(len(scores)), key=scores.__getitem__), max(range(len(norm)), key=norm.__getitem__)
        correct += pred == example.label
        correct_norm += pred_norm == example.label
        records.append(
            {"id": example.id, "label": example.label, "pred": pred, "pred_norm": pred_norm, "logprobs": scores}
        )
    n = len(examples)
    return {
        "acc": correct / n,
        "acc_norm": correct_norm / n,
        "n": n,
        "num_fewshot": num_fewshot,
        "truncated": truncated,
        "records": records,
    }


def mc_eval(
    checkpoint: str,
    tasks: list[str],
    num_fewshot: int = 0,
    fewshot_file: str | None = None,
    seed: int = 1234,
    delimiter: str = " ",
    shot_separator: str = "\n\n",
    limit: int | None = None,
    output: str | None = None,
    tokenizer: str | None = None,
    bpe_file: str | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """Evaluate a checkpoint on multiple-choice jsonl tasks; print a table, optionally write JSON.

    Args:
        checkpoint: the LM's ``.ckpt``.
        tasks: jsonl files (see the module docstring).
        num_fewshot: solved examples before each question.
        fewshot_file: jsonl to draw shots from (default: the other questions of the same file).
        seed: shot sampling seed.
        delimiter: text between context and choice.
        shot_separator: text after each shot.
        limit: score only the first this many questions of each file.
        output: write the results (with per-question records) to this JSON file.
        tokenizer: the checkpoint's tokenizer (default: read from it).
        bpe_file: local BPE vocabulary file.
        device: torch device to run on.
    """
    from lightning_cqk.inference.pretrained import load_pretrained

    pretrained = load_pretrained(checkpoint, tokenizer=tokenizer, bpe_file=bpe_file)
    model = pretrained.model.to(device).eval()
    pool = load_mc_jsonl(fewshot_file) if fewshot_file else None
    results: dict[str, Any] = {"checkpoint": checkpoint, "num_fewshot": num_fewshot, "seed": seed, "tasks": {}}
    print(f"| task | n | acc | acc_norm |   ({num_fewshot}-shot, {checkpoint})\n|---|---|---|---|")
    for path in tasks:
        examples = load_mc_jsonl(path)[:limit]
        r = evaluate_mc(
            model,
            pretrained.tokenizer,
            examples,
            model.context_length,
            num_fewshot,
            pool,
            seed,
            delimiter,
            shot_separator,
        )
        results["tasks"][Path(path).stem] = r
        print(f"| {Path(path).stem} | {r['n']} | {100 * r['acc']:.1f} | {100 * r['acc_norm']:.1f} |")
    for name, r in results["tasks"].items():
        if r["truncated"]:
            print(
                f"{name}: {r['truncated']} of {r['n']} prompts lost tokens from their start to fit the model's "
                f"{model.context_length} positions (fewer --num_fewshot shots keep more of each question)."
            )
    if output:
        write_json_atomically(output, results)
    return results


def mc_eval_command(argv: list[str]) -> None:
    """``lightning_cqk mc-eval ...`` (jsonargparse over ``mc_eval``)."""
    from jsonargparse import CLI

    CLI(mc_eval, args=argv, prog="lightning_cqk mc-eval", as_positional=False)
