"""Hybrid layer patterns: which layers of a model keep standard attention.

Paper: H. Xue, N. S. Moosavi and N. Aletras, "Deconstructing Attention: Investigating Design Principles for
Effective Language Modeling", arXiv 2510.11602 (2025). Its hybrid models put a simplified attention variant in some
layers and standard attention in the others; Table 11 lists, for its 24-layer model, the layers (1-based) that keep
**standard** attention. `resolve_layer_pattern` turns such a pattern into 0-based layer indices for a model of any
depth, so a config can say ``layer_overrides: [{pattern: even, attention: standard}]``.

Named patterns (L = n_layer; sets are 1-based as in the paper; Table 11 at L = 24 in brackets):

    even       {2, 4, ..., }                 every second layer, the paper's main hybrid   [2, 4, ..., 24]
    odd        {1, 3, ..., }                                                               [1, 3, ..., 23]
    top        {1 .. L//2}                   the simple variant fills the top half         [1..12]
    middle     {1 .. L//4} + {L-L//4+1 .. L} the simple variant fills the middle half      [1..6, 19..24]
    bottom     {L-L//2+1 .. L}               the simple variant fills the bottom half      [13..24]
    25%        {4, 8, ..., }                 every fourth layer                            [4, 8, 12, 16, 20, 24]
    first      {1}                                                                         [1]
    last       {L}                                                                         [24]
    bilateral  {1, L}                                                                      [1, 24]

Generalising from 24 layers [NS: the paper only uses L = 24]: halves use L//2 standard layers (the same count as
`even`), so for odd L the simple variant gets the extra layer; `middle` keeps L//4 layers at each end. The paper's
§6 text calls "bottom" the "initial layers (1-6)", which conflicts with Table 11; we follow Table 11 (the table is
what the experiments list) and flag the conflict here.

Explicit sets are comma-separated 1-based layers and inclusive ranges: ``"1,3,5"``, ``"1-6,19-24"``. They avoid the
off-by-one trap between the paper's odd/even (1-based) and Python's 0-based indices (`docs/papers.md` §6 item
13). Errors name the problem: an unknown pattern lists the names, an out-of-range layer states the valid 1-based
range, a malformed or repeated item is quoted, and a pattern that selects no layer at this depth says so.

Tests (`tests/unit/attention/test_hybrid.py`): every named pattern at 24 layers equals Table 11 (converted to 0-based);
explicit sets and ranges; the errors; a hybrid GPT built from a pattern has the right backend in every layer.
"""

from __future__ import annotations

import re
from collections.abc import Callable

#: The named patterns: name -> (n_layer -> 1-based layers that keep standard attention).
NAMED_PATTERNS: dict[str, Callable[[int], list[int]]] = {
    "even": lambda L: list(range(2, L + 1, 2)),
    "odd": lambda L: list(range(1, L + 1, 2)),
    "top": lambda L: list(range(1, L // 2 + 1)),
    "middle": lambda L: list(range(1, L // 4 + 1)) + list(range(L - L // 4 + 1, L + 1)),
    "bottom": lambda L: list(range(L - L // 2 + 1, L + 1)),
    "25%": lambda L: list(range(4, L + 1, 4)),
    "first": lambda L: [1],
    "last": lambda L: [L],
    "bilateral": lambda L: sorted({1, L}),
}

_ITEM = re.compile(r"^(\d+)(?:\s*-\s*(\d+))?$")


def pattern_names() -> list[str]:
    """The named patterns, in the order of the paper's Table 11."""
    return list(NAMED_PATTERNS)


def resolve_layer_pattern(pattern: str, n_layer: int) -> list[int]:
    """0-based indices of the layers that a hybrid pattern assigns (for the paper: the standard-attention layers).

    Args:
        pattern: a named pattern (see `NAMED_PATTERNS`, case-insensitive) or a comma-separated list of 1-based
            layers and inclusive ranges such as ``"1,3,5"`` or ``"1-6,19-24"``.
        n_layer: number of layers of the model.

    Returns:
        Sorted 0-based layer indices, without duplicates.

    Raises:
        ValueError: unknown name, malformed item, layer outside 1..n_layer, repeated layer, or empty selection.
    """
    if not isinstance(n_layer, int) or n_layer < 1:
        raise ValueError(f"n_layer must be a positive integer, got {n_layer!r}.")
    text = str(pattern).strip()
    if not text:
        raise ValueError(f"Empty layer pattern. Use one of {', '.join(NAMED_PATTERNS)} or 1-based layers like '1,3,5'.")
    named = NAMED_PATTERNS.get(text.lower())
    if named is not None:
        layers = named(n_layer)
        if not layers:
            raise ValueError(
                f"Layer pattern {text!r} selects no layer in a {n_layer}-layer model; use an explicit set of "
                f"1-based layers (1..{n_layer}) instead."
            )
        return [layer - 1 for layer in layers]
    if not re.fullmatch(r"[\d\s,\-]+", text):
        raise ValueError(
            f"Unknown layer pattern {text!r}. Named patterns: {', '.join(NAMED_PATTERNS)}; or give 1-based layers "
            "and inclusive ranges, e.g. '1,3,5' or '1-6,19-24'."
        )
    chosen: list[int] = []
    for item in text.split(","):
        item = item.strip()
        match = _ITEM.match(item)
        if match is None:
            raise ValueError(
                f"Cannot read {item!r} in layer pattern {text!r}: expected a 1-based layer like '3' or an inclusive "
                "range like '1-6', separated by commas."
            )
        start = int(match.group(1))
        stop = int(match.group(2)) if match.group(2) is not None else start
        if stop < start:
            raise ValueError(f"Range {item!r} in layer pattern {text!r} runs backwards; write it as '{stop}-{start}'.")
        for layer in range(start, stop + 1):
            if not 1 <= layer <= n_layer:
                raise ValueError(
                    f"Layer {layer} in pattern {text!r} is out of range: layers are 1-based, 1..{n_layer} for a "
                    f"{n_layer}-layer model."
                )
            if layer in chosen:
                raise ValueError(f"Layer {layer} appears more than once in layer pattern {text!r}.")
            chosen.append(layer)
    return sorted(layer - 1 for layer in chosen)
