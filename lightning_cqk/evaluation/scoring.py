"""Log-likelihood of token continuations under a GPT, batched: the one scoring path of `eval` and `mc-eval`.

A request is ``(context_ids, continuation_ids)``. The model reads the last ``block_size + 1`` tokens of
``context + continuation`` minus the final one (a long context loses tokens from its start, as evaluation harnesses
do), and the continuation's tokens are scored::

    log p(continuation | context) = sum_i log softmax(logits_{t_i - 1})[t_i]     over the continuation's positions t_i

``is_greedy`` says whether every continuation token is the argmax of the logits that predict it (lm-eval's
``loglikelihood`` second value). The softmax runs over every row the output head has (``padded_vocab_size``): that
is the distribution the model was trained and validated with (the padding rows are never targets and end up with
~zero probability); the log-probabilities are computed in fp32, or fp64 for an fp64 model.

Batching: the requests are sorted by length (longest first, so a batch pads little) and right-padded; a causal LM's
logits at a position do not depend on what follows, so the padding changes nothing (tested against one request at
a time). Results come back in the order of the requests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F


def truncate_window(context: Sequence[int], continuation: Sequence[int], block_size: int) -> list[int]:
    """The tokens the model reads and predicts: the last ``block_size + 1`` of ``context + continuation``.

    Raises:
        ValueError: an empty context (the first continuation token has nothing to condition on), or a continuation
            that alone does not fit in ``block_size`` tokens.
    """
    if not context:
        raise ValueError(
            "A continuation needs at least one context token to condition on (lm-eval puts EOS before a continuation "
            "whose context is empty); give a non-empty context."
        )
    if len(continuation) > block_size:
        raise ValueError(
            f"A continuation of {len(continuation)} tokens cannot be scored in one window of block_size {block_size}; "
            "score long texts with loglikelihood_rolling (an lm-eval task with output_type: loglikelihood_rolling)."
        )
    return [*context, *continuation][-(block_size + 1) :]


@torch.no_grad()
def score_continuations(
    model: torch.nn.Module,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    block_size: int,
    batch_size: int = 16,
    progress: Callable[[int], None] | None = None,
) -> list[tuple[float, bool]]:
    """``(log p(continuation | context), is_greedy)`` of every request; see the module docstring.

    Args:
        model: token ids (B, T) -> logits (B, T, V), causal, in eval mode.
        requests: ``(context_ids, continuation_ids)`` pairs; an empty continuation scores ``(0.0, True)``.
        block_size: the model's context length.
        batch_size: sequences per forward.
        progress: called with the number of requests each batch scored (a progress bar's ``update``).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    results: list[tuple[float, bool] | None] = [None] * len(requests)
    rows = []
    for i, (context, continuation) in enumerate(requests):
        if not continuation:
            results[i] = (0.0, True)
            continue
        rows.append((i, truncate_window(context, continuation, block_size), len(continuation)))
    rows.sort(key=lambda r: (-len(r[1]), r[0]))
    device = next(model.parameters()).device
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        width = len(batch[0][1]) - 1  # longest first
        inputs = torch.zeros(len(batch), width, dtype=torch.long)  # (N, T) right-padded
        for b, (_, seq, _) in enumerate(batch):
            inputs[b, : len(seq) - 1] = torch.tensor(seq[:-1])
        logits = model(inputs.to(device))  # (N, T, V)
        if logits.dtype != torch.float64:
            logits = logits.float()
        logp = F.log_softmax(logits, dim=-1)  # (N, T, V)
        for b, (i, seq, n) in enumerate(batch):
            end = len(seq) - 1
            scored = logp[b, end - n : end]  # (n, V): the positions that predict the continuation
            target = torch.tensor(seq[-n:], device=scored.device)  # (n,)
            total = scored.gather(-1, target.unsqueeze(-1)).sum()
            greedy = bool((scored.argmax(dim=-1) == target).all())
            results[i] = (float(total), greedy)
        if progress is not None:
            progress(len(batch))
    return results  # type: ignore[return-value]
