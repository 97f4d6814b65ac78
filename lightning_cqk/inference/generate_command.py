"""``lightning_cqk generate``: read samples of text from a trained checkpoint, streamed as they are produced.

    lightning_cqk generate --checkpoint runs/quickstart/standard-tiny-s1337/checkpoints/last.ckpt \
        --prompt "def fibonacci(n):" [--prompt "Another"] [--prompt_file prompts.txt] \
        [--max_new_tokens 200] [--temperature 0.8] [--top_k 40] [--top_p 0.95] [--seed 0] [--num_samples 1]

The model and its tokenizer come from the checkpoint (`lightning_cqk.inference.pretrained.load_pretrained`: the
tokenizer recorded at training, checked against the training data's vocabulary when that is readable). Each prompt
starts a document: it is preceded by the end-of-document id, which precedes every document in the training shards
(`--no_prefix_eos` feeds the prompt alone; an empty prompt then is refused). A row stops at EOS (`--ignore_eos`
runs on to `--max_new_tokens`). Past the model's block_size: `--context_policy refuse` (default; the error says how
many tokens fit) or `slide` (docs/inference.md).

Output: with `--batch_size 1` (default) every sample is streamed to stdout as its tokens arrive, one after another;
with `--batch_size n`, n samples are generated together (one batched forward per token) and each is printed when it
ends. Samples are headed `=== sample i/N (prompt j) ===` when there are several; the prompt is echoed before its
continuation (`--no_echo` prints the continuation only). A summary per sample (tokens, why it ended, tokens/s) goes to
stderr. Sampling is reproducible: one generator seeded by `--seed` draws every token, so the same command gives the
same text (a different `--batch_size` changes which draws each row gets).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from lightning_cqk.inference.generate import CONTEXT_POLICIES, ContextTooLong, can_cache, generate
from lightning_cqk.inference.pretrained import load_pretrained
from lightning_cqk.inference.sampling import SamplingConfig, make_generator
from lightning_cqk.inference.text import TextStream

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning_cqk generate",
        description="Generate text from a checkpoint, streamed to stdout (docs/inference.md).",
    )
    parser.add_argument("--checkpoint", required=True, help="a .ckpt written by `lightning_cqk fit`")
    parser.add_argument("--prompt", action="append", default=None, help="a prompt; repeat for several")
    parser.add_argument("--prompt_file", default=None, help="a text file, one prompt per line (blank lines skipped)")
    parser.add_argument("--max_new_tokens", type=int, default=200, help="new tokens per sample, at most (default 200)")
    parser.add_argument("--temperature", type=float, default=1.0, help="0 is greedy decoding (default 1.0)")
    parser.add_argument("--top_k", type=int, default=None, help="sample among the k most probable tokens")
    parser.add_argument("--top_p", type=float, default=None, help="nucleus sampling: smallest set of mass >= top_p")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling generator (default 0)")
    parser.add_argument("--num_samples", type=int, default=1, help="samples per prompt (default 1)")
    parser.add_argument("--batch_size", type=int, default=1, help="samples generated together (default 1: streamed)")
    parser.add_argument(
        "--context_policy",
        default="refuse",
        choices=CONTEXT_POLICIES,
        help="past block_size: refuse (default, says what fits) or slide (re-prefill the most recent tokens)",
    )
    parser.add_argument("--slide_shift", type=int, default=None, help="slide: tokens dropped per slide (block/4)")
    parser.add_argument("--ignore_eos", action="store_true", help="do not stop at the end-of-document token")
    parser.add_argument("--no_prefix_eos", action="store_true", help="do not start each prompt with the EOS id")
    parser.add_argument("--no_echo", action="store_true", help="print the continuation only, not the prompt")
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=tuple(DTYPES),
        help="model and cache dtype (default float32; casts the whole model, its RoPE tables included)",
    )
    parser.add_argument("--tokenizer", default=None, help="tokenizer name (default: read from the checkpoint)")
    parser.add_argument("--bpe_file", default=None, help="local GPT-2 .tiktoken file (default: as recorded)")
    return parser


def read_prompts(prompts: list[str] | None, prompt_file: str | None) -> list[str]:
    """The prompts of --prompt (in order) then of --prompt_file (one per non-blank line)."""
    out = list(prompts or [])
    if prompt_file is not None:
        path = Path(prompt_file)
        if not path.is_file():
            raise ValueError(f"--prompt_file {path} does not exist; give a text file with one prompt per line.")
        out += [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not out:
        raise ValueError('no prompt: give --prompt "some text" (repeatable) or --prompt_file FILE.')
    return out


def generate_command(argv: list[str]) -> None:
    """``lightning_cqk generate ...``: errors in the arguments or the checkpoint end the command with a message."""
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except ContextTooLong as err:
        sys.exit(f"lightning_cqk generate: {context_message(err, args)}")
    except (FileNotFoundError, ValueError) as err:
        sys.exit(f"lightning_cqk generate: {err}")


def context_message(err: ContextTooLong, args: argparse.Namespace) -> str:
    """`ContextTooLong` in the command's own flags."""
    eos = "" if args.no_prefix_eos else " (the end-of-document id before it included)"
    which = "the longest prompt" if err.several else "a prompt"
    head = f"{which} of {err.prompt_len} tokens{eos} and --max_new_tokens {args.max_new_tokens} need {err.needed} "
    head += (
        f"positions, more than the model's context_length {err.block_size} (its block_size, or a shorter fixed stream)"
    )
    fix = f"pass --max_new_tokens {err.fit}" if err.fit else f"shorten the prompt to {err.block_size} tokens or less"
    return f"{head}: {fix}, or --context_policy slide to keep generating with a window of the most recent tokens."


def run(args: argparse.Namespace) -> None:
    prompts = read_prompts(args.prompt, args.prompt_file)
    for name in ("max_new_tokens", "num_samples", "batch_size"):
        if getattr(args, name) < (0 if name == "max_new_tokens" else 1):
            raise ValueError(f"--{name} must be >= {0 if name == 'max_new_tokens' else 1}, got {getattr(args, name)}.")
    if args.top_k is not None and args.top_k < 1:  # the library's message offers None, which a flag cannot take
        raise ValueError(f"--top_k must be >= 1 (1 is greedy); leave --top_k out for no limit, got {args.top_k}.")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ValueError(f"--top_p must be in (0, 1]; leave --top_p out (or pass 1) for no limit, got {args.top_p}.")
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)  # checks the values before loading anything
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    pretrained = load(args.checkpoint, args.tokenizer, args.bpe_file)
    model = pretrained.model.to(device=device, dtype=DTYPES[args.dtype]).eval()
    tok = pretrained.tokenizer
    prefix = [] if args.no_prefix_eos else [tok.eos_id]
    jobs = [(j, text) for j, text in enumerate(prompts) for _ in range(args.num_samples)]  # sample i: prompt j
    ids = [prefix + tok.encode(text) for _, text in jobs]
    generator = make_generator(args.seed, device)
    options = dict(
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        generator=generator,
        eos_id=None if args.ignore_eos else tok.eos_id,
        context_policy=args.context_policy,
        slide_shift=args.slide_shift,
    )
    generate(model, ids, args.max_new_tokens, **options)  # every prompt checked (block_size) before any output
    if not can_cache(model):
        print("[no cache: a layer's backend defines no new_cache; every token recomputes its window]", file=sys.stderr)
    out = sys.stdout
    for first in range(0, len(jobs), args.batch_size):
        rows = list(range(first, min(first + args.batch_size, len(jobs))))
        streams = {r: TextStream(tok.decode) for r in rows}
        counts, reasons = dict.fromkeys(rows, 0), {}
        live = len(rows) == 1
        steps = generate(model, [ids[r] for r in rows], args.max_new_tokens, **options)  # checks before any output
        t0 = time.perf_counter()
        if live:
            _header(out, rows[0], jobs, args)
        for step in steps:
            for i, t in zip(step.rows, step.tokens):
                r = rows[i]
                counts[r] += 1
                text = streams[r].push([t])
                if live and text:
                    out.write(text)
                    out.flush()
            for i, why in step.finished.items():
                reasons[rows[i]] = why
                if not live:
                    _header(out, rows[i], jobs, args)
                    out.write(streams[rows[i]].flush())
                    _footer(out, rows[i], counts, why, t0)
        if live:
            out.write(streams[rows[0]].flush())
            _footer(out, rows[0], counts, reasons.get(rows[0], "length"), t0)


def load(checkpoint: str, tokenizer: str | None, bpe_file: str | None):
    """`load_pretrained` (a missing, truncated, corrupt or untrusted file is refused there, by name), with a tokenizer
    that cannot be loaded here reported as a ValueError."""
    try:
        return load_pretrained(checkpoint, tokenizer=tokenizer, bpe_file=bpe_file)
    except RuntimeError as err:  # e.g. a BPE vocabulary that cannot be had here (the message says)
        raise ValueError(f"cannot load {checkpoint}: {err}") from err


def _header(out, r: int, jobs: list[tuple[int, str]], args: argparse.Namespace) -> None:
    if len(jobs) > 1:
        out.write(f"=== sample {r + 1}/{len(jobs)} (prompt {jobs[r][0] + 1}) ===\n")
    if not args.no_echo:
        out.write(jobs[r][1])
    out.flush()


def _footer(out, r: int, counts: dict[int, int], why: str, t0: float) -> None:
    out.write("\n")
    out.flush()
    seconds = time.perf_counter() - t0
    rate = counts[r] / seconds if seconds > 0 else float("nan")
    print(f"[sample {r + 1}: {counts[r]} tokens, ended by {why}, {rate:.1f} tokens/s]", file=sys.stderr, flush=True)
