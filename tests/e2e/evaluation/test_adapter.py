"""The lm-eval model class against direct computations with the model (fp64): loglikelihood (lm-eval's tokenisation,
the EOS prefix, left truncation, is_greedy), loglikelihood_rolling (every token predicted once, in lm-eval's windows),
generate_until (stop sequences, max_gen_toks, batching, prompt truncation) and the settings it refuses."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from lmeval_helpers import BLOCK

pytest.importorskip("lm_eval", reason="lm-eval is the `eval` extra: pip install -e '.[eval]' (make test installs it)")

from lm_eval.api.instance import Instance  # noqa: E402

from lightning_cqk import attention  # noqa: E402
from lightning_cqk.evaluation.lm import CQKLM  # noqa: E402
from lightning_cqk.evaluation.scoring import score_continuations  # noqa: E402
from lightning_cqk.model import GPT  # noqa: E402
from lightning_cqk.model_config import ModelConfig  # noqa: E402


def _lm(model, tokenizer, **kwargs) -> CQKLM:
    kwargs.setdefault("batch_size", 3)
    return CQKLM(model=model, tokenizer=tokenizer, dtype="float64", device="cpu", **kwargs)


def _req(kind: str, *args) -> Instance:
    return Instance(kind, {}, tuple(args), 0)


def _next_logp(model, ids: list[int]) -> torch.Tensor:
    """log p(. | ids) from a full forward over exactly these ids (the reference: no batching, no padding)."""
    with torch.no_grad():
        return F.log_softmax(model(torch.tensor([ids]))[0, -1], dim=-1)  # (V,)


def _reference(model, context: list[int], continuation: list[int], block: int = BLOCK) -> tuple[float, bool]:
    """Token by token, each continuation token read after the last `block` tokens before it that lie inside the
    harness's window (the last block + 1 tokens of context + continuation)."""
    window = (context + continuation)[-(block + 1) :]
    total, greedy = 0.0, True
    for p in range(len(window) - len(continuation), len(window)):
        logp = _next_logp(model, window[:p])
        total += float(logp[window[p]])
        greedy &= int(logp.argmax()) == window[p]
    return total, greedy


def test_loglikelihood_equals_a_direct_computation(model, tokenizer):
    enc = tokenizer.encode
    eos = tokenizer.eos_id
    pairs = [
        ("the cat", " sat"),
        ("the cat ", "sat"),  # lm-eval moves the context's trailing space into the continuation
        ("", "abc"),  # empty context: EOS is the context
        ("x" * 40, " y and z"),  # longer than the block: the context loses its start
    ]
    want_by_convention = {
        False: [
            (enc("the cat"), enc(" sat")),
            (enc("the cat"), enc(" sat")),
            ([eos], enc("abc")),
            (enc("x" * 40), enc(" y and z")),
        ],
        True: [
            ([eos, *enc("the cat")], enc(" sat")),
            ([eos, *enc("the cat")], enc(" sat")),
            ([eos], enc("abc")),
            ([eos, *enc("x" * 40)], enc(" y and z")),
        ],
    }
    for prefix_eos, expected in want_by_convention.items():
        lm = _lm(model, tokenizer, prefix_eos=prefix_eos)
        got = lm.loglikelihood([_req("loglikelihood", *p) for p in pairs])
        assert lm.truncated["loglikelihood"] == 1 and lm.get_model_info()["truncated_requests"]["loglikelihood"] == 1
        want = [_reference(model, c, k) for c, k in expected]
        assert [g for _, g in got] == [w for _, w in want]
        assert [ll for ll, _ in got] == pytest.approx([ll for ll, _ in want], rel=1e-10, abs=1e-10)
    # the EOS prefix changes the score of a short context (the convention matters, docs/evaluation.md)
    first = [_req("loglikelihood", *pairs[0])]
    plain, prefixed = (_lm(model, tokenizer, prefix_eos=flag).loglikelihood(first) for flag in (False, True))
    assert abs(plain[0][0] - prefixed[0][0]) > 1e-6


def test_is_greedy_is_true_for_the_argmax_continuation(model, tokenizer):
    context = tokenizer.encode("the cat")
    greedy = []
    for _ in range(3):
        greedy.append(int(_next_logp(model, context + greedy).argmax()))
    assert all(t < 256 for t in greedy), "the test model should continue with bytes"
    other = [(greedy[0] + 1) % 256, *greedy[1:]]
    got = score_continuations(model, [(context, greedy), (context, other)], BLOCK, batch_size=2)
    assert got[0][1] is True and got[1][1] is False
    assert got[0][0] == pytest.approx(_reference(model, context, greedy)[0], rel=1e-10)


def test_scoring_refuses_what_it_cannot_score(model):
    with pytest.raises(ValueError, match="at least one context token"):
        score_continuations(model, [([], [1, 2])], BLOCK)
    with pytest.raises(ValueError, match="cannot be scored in one window of block_size 16.*loglikelihood_rolling"):
        score_continuations(model, [([1], list(range(17)))], BLOCK)
    assert score_continuations(model, [([1], [])], BLOCK) == [(0.0, True)]


def test_loglikelihood_rolling_equals_the_summed_token_nll(model, tokenizer):
    eos = tokenizer.eos_id
    short = "a short doc"  # fits one window: one forward of EOS + doc predicts every token
    long = "every token of a long document is predicted exactly once"  # 56 tokens: 4 windows of 16
    got = _lm(model, tokenizer).loglikelihood_rolling([_req("loglikelihood_rolling", t) for t in (short, long, "")])
    ids = tokenizer.encode(short)
    with torch.no_grad():
        logp = F.log_softmax(model(torch.tensor([[eos, *ids[:-1]]]))[0], dim=-1)  # (T, V)
    assert got[0] == pytest.approx(float(logp.gather(-1, torch.tensor(ids)[:, None]).sum()), rel=1e-10)
    # lm-eval's windows of block B: tokens [cB, (c+1)B) are predicted reading the B tokens that end just before the
    # window's last token ([EOS] + doc for the first); the last window is full-length and scores only its new tokens.
    ids = tokenizer.encode(long)
    n, total = len(ids), 0.0
    for t in range(n):
        if t < BLOCK:
            context = [eos, *ids[:t]]
        else:
            end = min((t // BLOCK + 1) * BLOCK, n)
            context = ids[end - BLOCK - 1 : t]
        total += float(_next_logp(model, context)[ids[t]])
    assert got[1] == pytest.approx(total, rel=1e-10)
    assert got[2] == 0.0


def _ascii_model(model):
    """The test model with the output rows of non-ASCII bytes and EOS zeroed: it writes ASCII (one token, one
    character, so text positions are token positions)."""
    ascii_model = copy.deepcopy(model)
    with torch.no_grad():
        ascii_model.lm_head.weight[128:] = 0
    return ascii_model


def _greedy_text(model, tokenizer, context: str, n: int, keep: int) -> str:
    """n greedy tokens after the last `keep` tokens of the context, with a full forward per token (no cache)."""
    ids = tokenizer.encode(context)[-keep:]
    out = []
    for _ in range(n):
        out.append(int(_next_logp(model, ids + out)[: tokenizer.vocab_size].argmax()))
    return tokenizer.decode(out)


def test_generate_until_honours_stop_sequences_and_max_gen_toks(model, tokenizer):
    model = _ascii_model(model)
    contexts = ["the cat", "a", "a context much longer than the sixteen-token block"]
    budget = 6
    lm = _lm(model, tokenizer, batch_size=2)
    free = lm.generate_until([_req("generate_until", c, {"until": [], "max_gen_toks": budget}) for c in contexts])
    # max_gen_toks tokens, each the argmax, after the context's last block_size - max_gen_toks tokens
    assert free == [_greedy_text(model, tokenizer, c, budget, BLOCK - budget) for c in contexts]
    assert all(len(text) == budget for text in free)
    # batched == one at a time
    alone = _lm(model, tokenizer, batch_size=1)
    assert alone.generate_until([_req("generate_until", c, {"max_gen_toks": budget}) for c in contexts]) == free
    # a stop sequence ends the generation (fewer forwards) and is cut from the text
    stop = free[0][2:4]
    calls = []
    hook = model.register_forward_hook(lambda *_: calls.append(1))
    settings = {"until": [stop, "\u00e9"], "max_gen_toks": budget}
    stopped = lm.generate_until([_req("generate_until", contexts[0], settings)])
    hook.remove()
    assert stopped == [free[0][: free[0].index(stop)]]
    assert len(calls) < budget
    # a plain-string `until` and lm-eval's max_new_tokens alias
    assert lm.generate_until([_req("generate_until", contexts[0], {"until": stop, "max_new_tokens": 3})]) == [
        free[0][:3].split(stop)[0]
    ]


def test_generation_prompts_keep_the_contexts_last_tokens(model, tokenizer, monkeypatch):
    import lightning_cqk.evaluation.lm as lm_module

    seen = []

    def record(model, prompts, n, **kwargs):
        seen.extend(prompts)
        return [[] for _ in prompts]

    monkeypatch.setattr(lm_module, "generate_all", record)
    long = "a context much longer than the sixteen-token block"
    for prefix_eos in (False, True):
        seen.clear()
        lm = _lm(model, tokenizer, prefix_eos=prefix_eos)
        lm.generate_until([_req("generate_until", c, {"max_gen_toks": 5}) for c in ("ab", "", long)])
        assert lm.truncated["generate_until"] == 1
        eos = [tokenizer.eos_id] if prefix_eos else []
        # sorted longest first; an empty context is EOS; a long one keeps its last block_size - max_gen_toks tokens
        assert seen == [tokenizer.encode(long)[-(BLOCK - 5) :], [*eos, *tokenizer.encode("ab")], [tokenizer.eos_id]]


def test_generation_settings_that_cannot_be_applied_are_refused(model, tokenizer):
    lm = _lm(model, tokenizer)
    with pytest.raises(ValueError, match=r"max_gen_toks=16 must lie in 1..15.*--gen_kwargs max_gen_toks=8"):
        lm.generate_until([_req("generate_until", "q", {"max_gen_toks": 16})])
    with pytest.raises(ValueError, match=r"\['num_beams'\] cannot be applied.*--include_path"):
        lm.generate_until([_req("generate_until", "q", {"num_beams": 4})])
    assert lm.max_gen_toks == BLOCK // 2  # default: min(256, block_size // 2)
    with pytest.raises(ValueError, match="give a number"):
        _lm(model, tokenizer, batch_size="auto")
    with pytest.raises(ValueError, match="either checkpoint"):
        CQKLM()


def test_sampling_is_seeded(model, tokenizer):
    settings = {"do_sample": True, "temperature": 1.0, "top_k": 50, "max_gen_toks": 8, "until": []}
    reqs = [_req("generate_until", "the cat", settings)]
    first = _lm(model, tokenizer, seed=3).generate_until(reqs)
    assert _lm(model, tokenizer, seed=3).generate_until(reqs) == first
    assert _lm(model, tokenizer, seed=4).generate_until(reqs) != first


@pytest.mark.parametrize("backend", attention.available())
def test_batched_scoring_equals_one_request_at_a_time_for_every_backend(backend):
    """Right padding is invisible (every backend is causal, reference-stream ones included): a batch of requests
    of different lengths scores as each alone, in fp64."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=257, n_layer=2, n_embd=32, n_head=4, mlp_hidden=64, block_size=BLOCK)
    model = GPT(replace(config, attention=backend)).double().eval()
    requests = [([256, 1, 2, 3], [4, 5]), ([256, *range(10, 30)], [7, 8, 9]), ([256, 40], [41])]
    batched = score_continuations(model, requests, BLOCK, batch_size=3)
    alone = [score_continuations(model, [r], BLOCK, batch_size=1)[0] for r in requests]
    assert [b[0] for b in batched] == pytest.approx([a[0] for a in alone], rel=1e-12, abs=1e-12)
    assert [b[1] for b in batched] == [a[1] for a in alone]


def test_sampled_repeats_in_different_batches_are_independent_draws(model, tokenizer):
    """lm-eval repeats a sampled request (`repeats: k`, e.g. maj@k) as k identical requests: batches after the first
    must not restart the generator, else every batch repeats the first one's samples."""
    settings = {"do_sample": True, "temperature": 1.0, "max_gen_toks": 8, "until": []}
    texts = _lm(model, tokenizer, batch_size=2).generate_until([_req("generate_until", "the cat", settings)] * 4)
    assert texts[0] != texts[1]
    assert texts[:2] != texts[2:], "the second batch drew the same samples as the first"


def test_a_whitespace_only_context_is_scored_like_an_empty_one(model, tokenizer):
    """lm-eval moves a context's trailing whitespace to the continuation; a context of whitespace alone is then empty
    and, like lm-eval's empty context, starts from EOS (instead of failing the whole evaluation)."""
    lm = _lm(model, tokenizer)
    (got,) = lm.loglikelihood([_req("loglikelihood", "  ", "ab")])
    (want,) = lm.loglikelihood([_req("loglikelihood", "", "  ab")])
    assert got == pytest.approx(want, rel=1e-12)


def test_top_k_zero_means_no_limit_as_in_hugging_face(model, tokenizer):
    """Task YAMLs are written for HF's generate, where top_k=0 disables top-k filtering."""
    lm = _lm(model, tokenizer)
    assert lm._generation_settings({"do_sample": True, "temperature": 1.0, "top_k": 0})["top_k"] is None
    assert lm._generation_settings({"do_sample": True, "temperature": 1.0, "top_k": 5})["top_k"] == 5


def test_a_fixed_reference_stream_shorter_than_block_size_is_the_window(tokenizer):
    """rnd_emb_qk with a stream of 12 < block_size 16 reads at most 12 positions: requests are cut to that window
    (scored like a model of block_size 12) instead of failing in the forward."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=257, n_layer=2, n_embd=32, n_head=4, mlp_hidden=64, block_size=BLOCK)
    model = GPT(replace(config, attention="rnd_emb_qk", attention_options={"length": 12})).double().eval()
    lm = _lm(model, tokenizer)
    assert lm.max_length == 12
    context, continuation = tokenizer.encode("a context longer than twelve"), tokenizer.encode(" ok")
    (got,) = lm.loglikelihood([_req("loglikelihood", "a context longer than twelve", " ok")])
    assert got[0] == pytest.approx(_reference(model, context, continuation, block=12)[0], rel=1e-10)
    assert lm.loglikelihood_rolling([_req("loglikelihood_rolling", "a document of more than twelve bytes")])
    assert lm.generate_until([_req("generate_until", "a context longer than twelve", {"max_gen_toks": 4})])
