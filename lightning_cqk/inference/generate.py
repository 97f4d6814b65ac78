"""Batched autoregressive generation with the KV cache, and the cache-free reference it is tested against.

    prompts (ragged lists of ids) -> left-padded (B, T) + mask -> prefill: model(idx, cache=, attention_mask=)
        -> sample the next token of every row -> model(next (B, 1), cache=) -> sample -> ...   (one Step per token)

`generate` yields a `Step` as soon as each token is chosen (for streaming). Rows that finish (EOS, a stop sequence,
or `max_new_tokens`) are removed from the batch and from the cache (`DecodeCache.select`), so they cost nothing
afterwards. `generate_reference` makes the same choices with a full forward over each row's whole context at every
step and no cache: the oracle of the tests and the "cache-free" baseline of the bench.

Positions: a left-padded row's first real token is at position 0 (the decode contract, docs/inference.md), so a
prompt gives the same tokens alone or batched with longer ones.

Past `block_size` (`context_policy`; here block_size is `GPT.context_length`: a model whose attention reads a fixed
reference stream shorter than block_size has only that many positions):
    refuse (default)  the prompt and the new tokens must fit: prompt + max_new_tokens - 1 <= block_size (the last
                      token is never fed back). Otherwise a ValueError says how many new tokens fit.
    slide             keep generating with a window of the most recent tokens: when a row's context would exceed
                      block_size, its oldest `slide_shift` tokens are dropped and the rest re-prefilled (positions
                      start again at 0). With RoPE or learned positions this is the only exact way: the cached keys
                      carry their old positions, so a cache cannot be shifted in place. The context seen stays between
                      block_size - slide_shift + 1 and block_size tokens; slide_shift = 1 is the exact sliding window
                      (one prefill per token), the default block_size // 4 re-prefills once per block_size / 4 tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from lightning_cqk.attention import AttentionBackend
from lightning_cqk.inference.sampling import SamplingConfig, make_generator, sample

ContextPolicy = Literal["refuse", "slide"]
CONTEXT_POLICIES: tuple[str, ...] = ("refuse", "slide")
StopRule = Sequence[Sequence[int]] | Callable[[int, list[int]], bool]
"""Token-id sequences (a row stops once its new tokens end with one) or a function (row, new ids) -> stop?"""


class ContextTooLong(ValueError):
    """A request needs more positions than block_size under context_policy "refuse".

    Attributes:
        prompt_len: tokens of the longest prompt.
        needed: positions it needs (prompt_len + max_new_tokens - 1).
        block_size: the model's.
        fit: the largest max_new_tokens that fits (0: the prompt alone is too long).
        several: whether there were several prompts (prompt_len is the longest's).
    """

    def __init__(self, prompt_len: int, max_new_tokens: int, block_size: int, several: bool) -> None:
        self.prompt_len, self.block_size, self.several = prompt_len, block_size, several
        self.needed, self.fit = prompt_len + max_new_tokens - 1, max_new_tokens_that_fit(prompt_len, block_size)
        which = "The longest prompt" if several else "A prompt"
        what = (
            f"at most {self.fit} new tokens fit (pass max_new_tokens={self.fit})"
            if self.fit
            else f"the prompt alone exceeds it (shorten it to at most {block_size} tokens)"
        )
        super().__init__(
            f"{which} of {prompt_len} tokens plus max_new_tokens={max_new_tokens} needs {self.needed} positions, more "
            f"than the model's context_length {block_size} (its block_size, or a shorter fixed reference stream): "
            f"{what}, or keep generating with a window of the last {block_size} tokens: context_policy='slide'."
        )


@dataclass(frozen=True)
class Step:
    """The tokens chosen at one decoding step.

    Attributes:
        rows: indices (into the prompts) of the rows that produced a token at this step, in increasing order.
        tokens: the token each of them produced (same order). An EOS or stop sequence is included.
        finished: the rows that finished at this step, with why: "eos", "stop" or "length" (max_new_tokens).
    """

    rows: tuple[int, ...]
    tokens: tuple[int, ...]
    finished: dict[int, str] = field(default_factory=dict)


def generate(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    stop: StopRule | None = None,
    context_policy: ContextPolicy = "refuse",
    slide_shift: int | None = None,
    use_cache: bool = True,
) -> Iterator[Step]:
    """Generate up to `max_new_tokens` tokens after each prompt, batched, yielding one `Step` per decoding step.

    Args:
        model: a `lightning_cqk.model.GPT` (anything with `config`, `new_cache` and `forward(idx, cache=,
            attention_mask=)`). It is put in eval mode for each forward and restored after (no dropout).
        prompts: token ids of each prompt (at least one token each; e.g. the tokenizer's EOS id to start a
            document from nothing).
        max_new_tokens: at most this many tokens per row (>= 0).
        temperature, top_k, top_p: `SamplingConfig` (temperature 0: greedy).
        seed: seeds a fresh generator on the model's device when `generator` is None (reproducible by default).
        generator: the generator to draw from (its device must be the model's); overrides `seed`.
        eos_id: a row finishes after producing it; None: rows run to `max_new_tokens`.
        stop: token-id sequences (a row finishes once its new tokens end with one) or a function
            `stop(row, new_ids) -> bool` called after every token of that row.
        context_policy: "refuse" or "slide" (module docstring).
        slide_shift: tokens dropped per slide (1 <= slide_shift < block_size); None: max(1, block_size // 4).
        use_cache: False runs the cache-free reference (`generate_reference`); so does a model with a layer whose
            backend defines no decode cache (`can_cache`: a plugin may leave `new_cache` out; it then recomputes the
            window every token).

    Returns:
        An iterator of `Step`s; the new ids of row r are `[s.tokens[s.rows.index(r)] for s in steps if r in
        s.rows]`. The arguments are checked at the call (a `ValueError`, `ContextTooLong` past block_size), before
        anything is computed.
    """
    sampling = SamplingConfig(temperature, top_k, top_p)
    block_size, vocab_size = _context_length(model), model.config.vocab_size
    prompts = [list(map(int, p)) for p in prompts]
    _check_prompts(prompts, vocab_size)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a whole number >= 0, got {max_new_tokens!r}.")
    shift = _check_context(prompts, max_new_tokens, block_size, context_policy, slide_shift)
    if not prompts or max_new_tokens == 0:
        return iter(())
    device = next(model.parameters()).device
    if generator is None and not sampling.greedy:
        generator = make_generator(seed, device)
    use_cache = use_cache and can_cache(model)
    return _generate(model, prompts, max_new_tokens, sampling, generator, eos_id, stop, shift, use_cache, device)


def can_cache(model: nn.Module) -> bool:
    """Whether every attention layer of `model` defines a decode cache (`AttentionBackend.new_cache`)."""
    blocks = getattr(model, "blocks", ())
    return all(type(block.attn).new_cache is not AttentionBackend.new_cache for block in blocks)


def _generate(
    model: nn.Module,
    prompts: list[list[int]],
    max_new_tokens: int,
    sampling: SamplingConfig,
    generator: torch.Generator | None,
    eos_id: int | None,
    stop: StopRule | None,
    shift: int,
    use_cache: bool,
    device: torch.device,
) -> Iterator[Step]:
    """The decoding loop of `generate` (arguments checked)."""
    block_size, vocab_size = _context_length(model), model.config.vocab_size
    starts = [_slide(len(p), 0, block_size, shift) for p in prompts]  # each row's window: history[start:]
    longest = max(len(p) - s for p, s in zip(prompts, starts))
    max_len = min(block_size, longest + max_new_tokens - 1)
    stepper = _CachedStepper(model, max_len, device) if use_cache else _ReferenceStepper(model, device)
    history = [list(p) for p in prompts]
    new = [[] for _ in prompts]
    active = list(range(len(prompts)))  # rows still generating, in increasing order; the batch's row order
    logits = stepper.prefill([history[r][starts[r] :] for r in active])  # (B, padded vocab)
    while True:
        tokens = sample(logits[:, :vocab_size], sampling, generator).tolist()  # B ids
        finished: dict[int, str] = {}
        for r, t in zip(active, tokens):
            history[r].append(t)
            new[r].append(t)
            reason = _finish_reason(r, new[r], eos_id, stop, max_new_tokens)
            if reason is not None:
                finished[r] = reason
        yield Step(tuple(active), tuple(tokens), finished)
        keep = [i for i, r in enumerate(active) if r not in finished]
        if not keep:
            return
        if len(keep) < len(active):
            stepper.select(keep)
            active, tokens = [active[i] for i in keep], [tokens[i] for i in keep]
        slid = False
        for r in active:
            start = _slide(len(history[r]), starts[r], block_size, shift)
            slid, starts[r] = slid or start != starts[r], start
        windows = [history[r][starts[r] :] for r in active]
        logits = stepper.prefill(windows) if slid else stepper.advance(windows, tokens)  # (B, padded vocab)


def generate_reference(
    model: nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int, **kwargs
) -> Iterator[Step]:
    """`generate` without a cache: every step runs the full forward over each row's whole context (no padding, rows
    of equal context length batched together). The oracle for the cached path; same arguments as `generate`."""
    return generate(model, prompts, max_new_tokens, use_cache=False, **kwargs)


def generate_all(model: nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int, **kwargs) -> list[list[int]]:
    """Run `generate` to the end; the new token ids of each prompt (EOS / stop sequence included)."""
    new: list[list[int]] = [[] for _ in prompts]
    for step in generate(model, prompts, max_new_tokens, **kwargs):
        for r, t in zip(step.rows, step.tokens):
            new[r].append(t)
    return new


def max_new_tokens_that_fit(prompt_len: int, block_size: int) -> int:
    """The largest max_new_tokens the refuse policy accepts for a prompt of `prompt_len` tokens (the last new token
    is never fed back, so it needs no room): block_size - prompt_len + 1, or 0 for a prompt longer than block_size."""
    return max(0, block_size - prompt_len + 1)


# ---------------------------------------------------------------------------------------------------------- checks
def _context_length(model: nn.Module) -> int:
    """The positions a sequence may have (`GPT.context_length`: block_size, or a shorter fixed reference stream)."""
    return int(getattr(model, "context_length", model.config.block_size))


def _check_prompts(prompts: list[list[int]], vocab_size: int) -> None:
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(
                f"prompt {i} is empty: a language model needs at least one token to condition on. Start it with "
                "the tokenizer's end-of-document id (what precedes every document in training), e.g. [eos_id]."
            )
        bad = [t for t in p if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt {i} has ids outside the model's vocabulary 0..{vocab_size - 1}: {bad[:5]}.")


def _check_context(
    prompts: list[list[int]], max_new_tokens: int, block_size: int, policy: str, slide_shift: int | None
) -> int:
    """Validate the context policy for these prompts; returns the slide shift (0 under refuse)."""
    if policy not in CONTEXT_POLICIES:
        raise ValueError(f"context_policy must be one of {', '.join(CONTEXT_POLICIES)}, got {policy!r}.")
    if policy == "slide":
        shift = max(1, block_size // 4) if slide_shift is None else slide_shift
        if isinstance(shift, bool) or not isinstance(shift, int) or not 1 <= shift < max(2, block_size):
            raise ValueError(
                f"slide_shift must be a whole number in [1, block_size - 1] = [1, {block_size - 1}], got {shift!r}."
            )
        return shift
    if slide_shift is not None:
        raise ValueError("slide_shift applies to context_policy 'slide' only; pass context_policy='slide' with it.")
    if max_new_tokens == 0 or not prompts:
        return 0
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens - 1 > block_size:
        raise ContextTooLong(longest, max_new_tokens, block_size, several=len(prompts) > 1)
    return 0


def _slide(length: int, start: int, block_size: int, shift: int) -> int:
    """The window start after a row has `length` tokens: advanced by `shift` until the window fits block_size."""
    if length - start > block_size and shift < 1:  # refuse: `_check_context` made sure no active row gets here
        raise RuntimeError(f"a row of {length} tokens outgrew block_size {block_size} under context_policy 'refuse'")
    while length - start > block_size:
        start += shift
    return start


def _finish_reason(row: int, new: list[int], eos_id: int | None, stop: StopRule | None, limit: int) -> str | None:
    if eos_id is not None and new[-1] == eos_id:
        return "eos"
    if stop is not None:
        if callable(stop):
            if stop(row, new):
                return "stop"
        elif any(len(s) and new[-len(s) :] == list(s) for s in stop):
            return "stop"
    return "length" if len(new) >= limit else None


# -------------------------------------------------------------------------------------------------------- steppers
def _left_pad(windows: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Ragged ids -> (B, T) ids left-padded with 0 and the (B, T) bool mask of real tokens (None when none pads)."""
    T = max(len(w) for w in windows)
    idx = torch.zeros(len(windows), T, dtype=torch.long)  # (B, T)
    mask = torch.zeros(len(windows), T, dtype=torch.bool)  # (B, T)
    for i, w in enumerate(windows):
        idx[i, T - len(w) :] = torch.tensor(w, dtype=torch.long)
        mask[i, T - len(w) :] = True
    if bool(mask.all()):
        return idx.to(device), None
    return idx.to(device), mask.to(device)


class _EvalMode:
    """Eval mode and inference mode for one forward (restored before `generate` yields, so the caller's code between
    steps runs with its own grad and training modes)."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.inference = model, torch.inference_mode()

    def __enter__(self) -> None:
        self.was_training = self.model.training
        if self.was_training:  # switching walks every module: only when needed (decode runs it per token)
            self.model.eval()
        self.inference.__enter__()

    def __exit__(self, *exc) -> None:
        self.inference.__exit__(*exc)
        if self.was_training:
            self.model.train()


class _CachedStepper:
    """Prefill once, then one token per row per forward through the model's `DecodeCache`."""

    def __init__(self, model: nn.Module, max_len: int, device: torch.device) -> None:
        self.model, self.max_len, self.device = model, max_len, device
        self.cache = None

    def prefill(self, windows: list[list[int]]) -> torch.Tensor:
        """A fresh cache holding `windows` (left-padded); the last position's logits (B, padded vocab)."""
        idx, mask = _left_pad(windows, self.device)  # (B, T) each
        with _EvalMode(self.model):
            self.cache = self.model.new_cache(len(windows), max(self.max_len, idx.size(1)))
            return self.model(idx, cache=self.cache, attention_mask=mask)[:, -1]  # (B, padded vocab)

    def advance(self, windows: list[list[int]], tokens: list[int]) -> torch.Tensor:
        """Feed each row's newest token; re-prefill when the padded cache is full (rows of the longest context
        finished and a shorter one needs room: its window still fits block_size)."""
        if self.cache.length + 1 > self.cache.max_len:
            return self.prefill(windows)
        idx = torch.tensor(tokens, dtype=torch.long, device=self.device)[:, None]  # (B, 1)
        with _EvalMode(self.model):
            return self.model(idx, cache=self.cache)[:, -1]  # (B, padded vocab)

    def select(self, keep: list[int]) -> None:
        self.cache.select(torch.tensor(keep, dtype=torch.long, device=self.device))


class _ReferenceStepper:
    """No cache: a full forward over every row's window at every step (rows of equal length share a forward)."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device

    def prefill(self, windows: list[list[int]]) -> torch.Tensor:
        by_length: dict[int, list[int]] = {}
        for i, w in enumerate(windows):
            by_length.setdefault(len(w), []).append(i)
        out: list[torch.Tensor | None] = [None] * len(windows)
        with _EvalMode(self.model):
            for rows in by_length.values():
                idx = torch.tensor([windows[i] for i in rows], dtype=torch.long, device=self.device)  # (b, T)
                last = self.model(idx)[:, -1]  # (b, padded vocab)
                for j, i in enumerate(rows):
                    out[i] = last[j]
        return torch.stack(out)  # (B, padded vocab)

    def advance(self, windows: list[list[int]], tokens: list[int]) -> torch.Tensor:
        return self.prefill(windows)

    def select(self, keep: list[int]) -> None:
        """Nothing is held between steps."""
