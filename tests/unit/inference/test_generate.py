"""`generate`: the cached path makes the cache-free oracle's choices (fp64), batching and padding change nothing,
rows stop and leave the batch, seeded sampling is reproducible, and the context policy past block_size."""

from __future__ import annotations

import pytest
import torch

from lightning_cqk.inference import generate, generate_all, generate_reference, max_new_tokens_that_fit
from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [40, 41], [100, 3, 200, 3, 7]]


def tiny_model(block_size: int = 24, dtype: torch.dtype = torch.float64, **kwargs) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(preset="tiny", vocab_size=257, block_size=block_size, n_layer=2, n_embd=32, n_head=4, **kwargs)
    return GPT(cfg).to(dtype).eval()


def naive_window_greedy(model: GPT, prompt: list[int], n: int) -> list[int]:
    """The textbook loop: full forward over the last block_size tokens, argmax (the exact sliding window)."""
    ids, V, block = list(prompt), model.config.vocab_size, model.config.block_size
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids[-block:]]))[0, -1, :V]  # (V,)
            ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize(
    "attention, options", [("standard", {}), ("standard", {"qkv_sharing": "k_eq_v", "n_kv_groups": 1})]
)
def test_cached_greedy_equals_cache_free_oracle(attention, options):
    model = tiny_model(attention=attention, attention_options=options)
    cached = generate_all(model, PROMPTS, 12, temperature=0)
    assert cached == generate_all(model, PROMPTS, 12, temperature=0, use_cache=False)
    assert [len(c) for c in cached] == [12, 12, 12]
    assert cached[0] == naive_window_greedy(model, PROMPTS[0], 12)


def test_batched_left_padded_rows_equal_each_prompt_alone():
    model = tiny_model(position="learned")  # learned positions: a pad must not shift a row's positions
    batched = generate_all(model, PROMPTS, 10, temperature=0)
    assert batched == [generate_all(model, [p], 10, temperature=0)[0] for p in PROMPTS]


def test_seeded_sampling_is_reproducible_and_cache_free_draws_the_same():
    model = tiny_model()
    kwargs = dict(temperature=1.0, top_k=50, top_p=0.95, seed=11)
    a = generate_all(model, PROMPTS, 15, **kwargs)
    assert a == generate_all(model, PROMPTS, 15, **kwargs)
    assert a == generate_all(model, PROMPTS, 15, use_cache=False, **kwargs)  # same logits -> same draws (fp64)
    assert a != generate_all(model, PROMPTS, 15, **{**kwargs, "seed": 12})
    g = torch.Generator().manual_seed(11)
    assert a == generate_all(model, PROMPTS, 15, generator=g, **{k: v for k, v in kwargs.items() if k != "seed"})


def test_rows_stop_at_eos_and_stop_sequences_and_leave_the_batch():
    model = tiny_model()
    free = generate_all(model, PROMPTS, 8, temperature=0)
    eos = free[1][2]  # row 1's third token: that row must end there (other rows: wherever eos first appears)
    stop = [free[2][3:5]]  # row 2 ends after its 5th token (unless eos comes first)
    steps = list(generate(model, PROMPTS, 8, temperature=0, eos_id=eos, stop=stop))
    got = [[t for s in steps for r, t in zip(s.rows, s.tokens) if r == row] for row in range(3)]
    reasons = {r: why for s in steps for r, why in s.finished.items()}
    assert got[1] == free[1][: free[1].index(eos) + 1] and reasons[1] == "eos"
    for row in (0, 2):
        assert got[row] == free[row][: len(got[row])]
    assert reasons[2] in ("stop", "eos") and len(got[2]) <= 5
    for s in steps:  # a finished row never produces another token
        assert not set(s.rows) & {r for prev in steps[: steps.index(s)] for r in prev.finished}
    assert sorted(reasons) == [0, 1, 2]


def test_stop_function_and_zero_tokens():
    model = tiny_model()
    out = generate_all(model, PROMPTS, 9, temperature=0, stop=lambda row, new: len(new) == row + 1)
    assert [len(o) for o in out] == [1, 2, 3]
    assert list(generate(model, PROMPTS, 0)) == []


def test_training_mode_is_restored_and_dropout_is_off():
    model = tiny_model(dropout=0.5)
    ref = generate_all(model, PROMPTS, 6, temperature=0)
    model.train()
    assert generate_all(model, PROMPTS, 6, temperature=0) == ref
    assert model.training


def test_refuse_says_what_fits_and_that_works():
    model = tiny_model(block_size=24)
    fit = max_new_tokens_that_fit(7, 24)
    assert fit == 18
    generate_all(model, PROMPTS, fit, temperature=0)  # the longest prompt has 7 tokens: 7 + 18 - 1 = 24 positions
    with pytest.raises(ValueError, match=f"at most {fit} new tokens fit.*max_new_tokens={fit}.*context_policy='slide'"):
        generate_all(model, PROMPTS, fit + 1, temperature=0)
    with pytest.raises(ValueError, match="the prompt alone exceeds it"):
        generate_all(model, [list(range(30))], 1, temperature=0)


def test_a_fixed_reference_stream_shorter_than_block_size_bounds_the_context():
    """rnd_emb_qk with a stream of L = 12 < block_size 16 reads at most 12 positions: refuse counts against 12 and
    says what fits; slide keeps windows of at most 12 tokens (cached == cache-free)."""
    model = tiny_model(block_size=16, attention="rnd_emb_qk", attention_options={"length": 12})
    assert model.context_length == 12
    prompt = [[1, 2, 3, 4, 5]]
    fit = max_new_tokens_that_fit(5, 12)
    assert generate_all(model, prompt, fit, temperature=0) == generate_all(
        model, prompt, fit, temperature=0, use_cache=False
    )
    with pytest.raises(ValueError, match=f"at most {fit} new tokens fit"):
        generate_all(model, prompt, fit + 1, temperature=0)
    slid = generate_all(model, prompt, 14, temperature=0, context_policy="slide", slide_shift=3)
    assert slid == generate_all(
        model, prompt, 14, temperature=0, context_policy="slide", slide_shift=3, use_cache=False
    )
    assert len(slid[0]) == 14


@pytest.mark.parametrize("shift", [1, 5])
def test_slide_cached_equals_oracle_past_block_size(shift):
    model = tiny_model(block_size=12)
    prompts = [list(range(20, 36)), [7, 8, 9]]  # the first prompt alone is longer than block_size
    cached = generate_all(model, prompts, 20, temperature=0, context_policy="slide", slide_shift=shift)
    assert cached == generate_all(
        model, prompts, 20, temperature=0, context_policy="slide", slide_shift=shift, use_cache=False
    )
    if shift == 1:  # the exact sliding window
        assert cached == [naive_window_greedy(model, p, 20) for p in prompts]


def test_slide_when_the_longest_row_finishes_first():
    """The longest row stops early; the padded cache of the others fills before their windows do (re-prefill)."""
    model = tiny_model(block_size=16)
    prompts = [list(range(30, 40)), [1, 2, 3]]
    stop = lambda row, new: row == 0 and len(new) == 3  # noqa: E731
    kwargs = dict(temperature=0, context_policy="slide", slide_shift=4, stop=stop)
    cached = generate_all(model, prompts, 25, **kwargs)
    assert cached == list(generate_reference_all(model, prompts, 25, **kwargs))
    assert [len(c) for c in cached] == [3, 25]


def generate_reference_all(model, prompts, n, **kwargs):
    new = [[] for _ in prompts]
    for step in generate_reference(model, prompts, n, **kwargs):
        for r, t in zip(step.rows, step.tokens):
            new[r].append(t)
    return new


@pytest.mark.parametrize(
    "prompts, kwargs, message",
    [
        ([[]], {}, "prompt 0 is empty.*eos_id"),
        ([[1, 300]], {}, "outside the model's vocabulary"),
        ([[1]], {"context_policy": "window"}, "context_policy must be one of"),
        ([[1]], {"slide_shift": 2}, "slide_shift applies to context_policy 'slide'"),
        (
            [[1]],
            {"context_policy": "slide", "slide_shift": 24},
            r"slide_shift must be a whole number in .* = \[1, 23\]",
        ),
    ],
)
def test_bad_arguments_are_refused(prompts, kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate_all(tiny_model(), prompts, 3, **kwargs)


def test_padded_vocabulary_rows_are_never_generated():
    """The head has padded_vocab_size rows; ids >= vocab_size are no token the tokenizer can decode, so generation
    chooses among the real vocabulary only, even when a padded row has the largest logit."""
    model = tiny_model(vocab_multiple=64)
    V, P = model.config.vocab_size, model.config.padded_vocab_size  # 257, 320
    assert P > V
    pad = torch.arange(V, P)
    hook = model.lm_head.register_forward_hook(lambda m, i, out: out.index_fill(-1, pad, 1e4))
    for kwargs in ({"temperature": 0}, {"temperature": 1.0, "top_p": 0.9}, {"temperature": 2.0, "top_k": 5}):
        new = generate_all(model, PROMPTS, 6, **kwargs)
        assert all(0 <= t < V for row in new for t in row), kwargs
    hook.remove()
