"""Next-token selection from logits: greedy, temperature, top-k and top-p (nucleus) sampling.

    logits (B, V) -> / temperature -> keep the top_k largest -> keep the smallest nucleus of mass >= top_p
                  -> softmax -> one draw per row from a `torch.Generator`          -> token ids (B,)

The filters apply in that order (temperature, top-k, top-p: the order of Holtzman et al. 2020, "The Curious Case of
Neural Text Degeneration", §3.1, and of most libraries). `temperature == 0` is greedy decoding (argmax; top-k and
top-p are then irrelevant). The draw uses the generator passed in, never the global one, so a seeded generator
makes generation reproducible and nothing else in the process moves it.

Nucleus rule (top-p): tokens are sorted by probability; a token is kept when the mass of the tokens ranked above
it is < top_p. The kept set is the smallest whose mass reaches top_p, and always holds the most probable token.
`top_p = 1` keeps every token; `top_k` larger than the vocabulary keeps every token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen.

    Attributes:
        temperature: logits are divided by it before sampling; 0 means greedy (argmax). Must be >= 0.
        top_k: sample among the k most probable tokens only; None: no limit. Must be >= 1.
        top_p: sample from the smallest set of most probable tokens whose probability reaches top_p; None or 1.0:
            no limit. Must be in (0, 1].
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, int | float) and math.isfinite(self.temperature)) or self.temperature < 0:
            raise ValueError(
                f"temperature must be a finite number >= 0 (0 is greedy decoding), got {self.temperature!r}."
            )
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int)):
            raise ValueError(f"top_k must be a whole number >= 1 or None (no limit), got {self.top_k!r}.")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 (1 is greedy decoding) or None (no limit), got {self.top_k}.")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 keeps every token) or None, got {self.top_p!r}.")

    @property
    def greedy(self) -> bool:
        """Whether the choice is deterministic argmax (temperature 0)."""
        return self.temperature == 0


def filter_logits(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Logits (B, V) -> float32 logits (B, V) minus each row's max (the softmax is unchanged), scaled by
    1 / temperature, with -inf outside the top-k and the nucleus.

    Not for temperature 0 (greedy needs no filtering: `sample` takes the argmax). Subtracting the max first keeps a
    tiny temperature from overflowing to inf (softmax NaN): it tends to greedy, as it should.
    """
    if config.greedy:
        raise ValueError("filter_logits is for sampling; temperature 0 is greedy decoding (argmax).")
    logits = logits.float()  # (B, V)
    shifted = logits - logits.amax(dim=-1, keepdim=True)  # (B, V), <= 0, the row's max at 0
    # 0 / temperature is NaN where the temperature rounds to 0 in fp32 (< 1.4e-45): the max stays at 0 there.
    logits = torch.where(shifted == 0, shifted, shifted / config.temperature)  # (B, V)
    V = logits.size(-1)
    if config.top_k is not None and config.top_k < V:
        kth = torch.topk(logits, config.top_k, dim=-1).values[:, -1:]  # (B, 1): the k-th largest logit
        logits = logits.masked_fill(logits < kth, float("-inf"))  # ties with the k-th logit are all kept
    if config.top_p is not None and config.top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V) each
        probs = torch.softmax(sorted_logits, dim=-1)  # (B, V)
        mass_before = torch.cumsum(probs, dim=-1) - probs  # (B, V): mass of the tokens ranked above each
        drop_sorted = mass_before >= config.top_p  # (B, V); rank 0 has mass_before 0 < top_p: always kept
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # (B, V) back in vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None = None) -> torch.Tensor:
    """Choose one token per row: logits (B, V) -> ids (B,) long.

    Args:
        logits: next-token logits of each row (only the real vocabulary: drop padded rows of the head first).
        config: temperature, top_k, top_p.
        generator: the source of randomness (on the logits' device); required unless greedy, so that a run is
            reproducible by construction.
    """
    if config.greedy:
        return logits.argmax(dim=-1)  # (B,)
    if generator is None:
        raise ValueError("sampling needs a torch.Generator (seeded for reproducibility); temperature 0 is greedy.")
    probs = torch.softmax(filter_logits(logits, config), dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on `device` seeded with `seed` (the draws of `sample` come from it alone)."""
    return torch.Generator(device=device).manual_seed(int(seed))
