"""Batched generation with the model's KV cache, until a stop condition or a token budget: `generate_until`'s engine.

Prompts of different lengths are LEFT-padded into one (B, P) batch and prefilled in one forward with an attention
mask (the decode contract of `GPT.forward(idx, cache=, attention_mask=)`: each token's position counts only the
real tokens before it, padded keys are never attended to, so a row's tokens are those it would get alone). Then
one token per row per forward, reading the cache. A row stops when its ``stop`` callback says so (lm-eval: a stop
sequence appears in its decoded text, or EOS was produced) or after ``max_new_tokens``; finished rows leave the
batch (``DecodeCache.select``) so they cost nothing more.

Choosing the next token: greedy (``temperature == 0``, the argmax, ties to the lowest id) or sampling from
``softmax(logits / temperature)`` restricted to the ``top_k`` most likely ids and to the smallest set whose
probability reaches ``top_p`` (Holtzman et al. 2020, nucleus sampling), drawn from a seeded generator. Only the real
vocabulary (ids below ``vocab_size``) is ever chosen: the output head's padding rows have no text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def pick_next(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The next token of every row, logits (B, V) -> ids (B,); see the module docstring."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}.")
    if temperature == 0:
        return logits.argmax(dim=-1)  # (B,)
    scaled = logits.float() / temperature  # (B, V)
    if top_k is not None and top_k > 0:
        kth = torch.topk(scaled, min(top_k, scaled.size(-1)), dim=-1).values[:, -1:]  # (B, 1)
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {top_p}.")
        sorted_logits, order = scaled.sort(dim=-1, descending=True)  # (B, V)
        probs = sorted_logits.softmax(dim=-1)  # (B, V)
        before = probs.cumsum(dim=-1) - probs  # (B, V): mass of the more likely ids
        drop = before >= top_p  # keeps the smallest prefix whose mass reaches top_p (at least one id)
        scaled = scaled.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = scaled.softmax(dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)


@torch.no_grad()
def generate_tokens(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    vocab_size: int,
    stop: Callable[[int, list[int]], bool] | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    pad_id: int = 0,
) -> list[list[int]]:
    """The tokens generated after each prompt (the prompt not included).

    Args:
        model: a GPT with the decode contract (``new_cache``; ``forward(idx, cache=, attention_mask=)``), eval mode.
        prompts: token ids of each prompt, at least one each; prompt + ``max_new_tokens`` must fit the model.
        max_new_tokens: tokens to generate at most per row.
        vocab_size: ids ``>= vocab_size`` (the output head's padding rows) are never chosen.
        stop: ``stop(row, tokens_so_far)`` -> True ends that row (its last token is kept; trim text afterwards).
        temperature, top_k, top_p, generator: how the next token is chosen (`pick_next`).
        pad_id: the id written into left padding (never read: the attention mask hides it).
    """
    if not prompts:
        return []
    if any(len(p) == 0 for p in prompts):
        raise ValueError("Every prompt needs at least one token (lm-eval contexts start with EOS when empty).")
    if max_new_tokens <= 0:
        return [[] for _ in prompts]
    B, P = len(prompts), max(len(p) for p in prompts)
    device = next(model.parameters()).device
    idx = torch.full((B, P), pad_id, dtype=torch.long)  # (B, P) left-padded
    mask = torch.zeros(B, P, dtype=torch.bool)  # (B, P): False = padding
    for b, p in enumerate(prompts):
        idx[b, P - len(p) :] = torch.tensor(list(p))
        mask[b, P - len(p) :] = True
    cache = model.new_cache(B, P + max_new_tokens)
    logits = model(idx.to(device), cache=cache, attention_mask=mask.to(device))[:, -1, :vocab_size]  # (B, V)
    out: list[list[int]] = [[] for _ in prompts]
    active = list(range(B))  # the original row of each row still in the batch
    for step in range(max_new_tokens):
        nxt = pick_next(logits, temperature, top_k, top_p, generator)  # (b,)
        keep = []
        for j, row in enumerate(active):
            out[row].append(int(nxt[j]))
            if not (stop is not None and stop(row, out[row])):
                keep.append(j)
        if not keep or step == max_new_tokens - 1:
            break
        if len(keep) < len(active):
            rows = torch.tensor(keep, device=device)
            cache.select(rows)
            nxt = nxt[rows]
            active = [active[j] for j in keep]
        logits = model(nxt.view(-1, 1), cache=cache)[:, -1, :vocab_size]  # (b, V)
    return out
