"""The contract every attention backend keeps, checked for every case of `backend_cases.CASES` (one harness).

For each (backend, options) case, in fp64 on the tiny model of `backend_cases.BASE_CONFIG`:
- causality: changing future inputs (and future token embeddings) never changes past outputs, for the layer alone
  and for the whole model; later outputs do change;
- fast path == math path (`impl="sdpa"` vs `impl="math"`): forward and every gradient (input, token embeddings,
  reference stream, every parameter) to 1e-10 relative;
- fp32 forward and backward are finite and every parameter gets a gradient;
- identity at init: every identity-initialised q/k transform (v2 invertible, v1 dynamics at dt = 0) composed with the
  case's mechanism gives the base model's logits, and acts once its parameters move;
- the Q/K seam (`AttentionBackend.qk_weights`, base.py): the stated matrices exist, their row blocks feed exactly
  the logit maps of their heads (a perturbed block changes those maps and no other), one map per query block (what
  QK-clip needs), and no parameter of the value / output groups changes the logits;
- decode parity: decoding with the cache token by token, after prefills of 1 and 6 tokens, in chunks and in one shot
  equals the full forward to 1e-10.
- learning: the tiny GPT over bytes (fp32, its own init) learns real text: 40 AdamW steps take the loss below 0.8 x
  its start (the check each backend's test file used to copy).

Coverage: a registered backend without a case, or an advertised option value (see `backend_cases`) without one,
fails `test_every_backend_and_advertised_option_has_a_case` with a message naming it. Tests below show that the
coverage check and the causality, fast-path, seam and learning checks can fail (dummy backends registered for the test).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import typing
from collections.abc import Iterator
from typing import Any, Literal

import pytest
import torch
import torch.nn.functional as F
from backend_cases import CASES, Case, build_model, case_params, model_config
from torch import nn

from lightning_cqk import attention
from lightning_cqk.attention import AttentionBackend, AttentionContext, AttentionOptions
from lightning_cqk.attention.base import QKWeight, QKWeights
from lightning_cqk.attention.functional import causal_attention, causal_logits
from lightning_cqk.attention.transform import transform_registry
from lightning_cqk.model import GPT

B, T, CUT = 2, 12, 7  # batch, tokens, first position changed by the causality checks
TOL = 1e-10  # relative, fast path vs math path and decode vs full forward
LEARN_STEPS = 40  # optimizer steps of the learning check
#: q/k transforms that are the identity at init (v2 by its zero last layer; v1 with dt = 0).
IDENTITY_TRANSFORMS = [
    {"kind": "invertible"},
    {"kind": "invertible", "rope_order": "post", "share_heads": True},
    {"kind": "invertible", "additive": True, "fused": False, "layers": 3},
    {"kind": "coupled", "dt_param": "raw", "dt_init": 0.0, "steps": 2},
    {"kind": "uncoupled_mlp", "dt_param": "raw", "dt_init": 0.0, "rope_order": "post"},
]
GROUPS = {"q", "k", "v", "out", "norms", "backend"}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def layer_under_test(model: GPT, case: Case) -> int:
    """The last layer of `model` that runs the case's backend (hybrids mix backends)."""
    return max(i for i, block in enumerate(model.blocks) if type(block.attn).name == case.backend)


def layer_inputs(model: GPT, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """x (B, T, C), token embeddings (B, T, C) and a random reference stream (1, block_size, C) per layer."""
    g = torch.Generator().manual_seed(seed)
    C, L = model.config.n_embd, model.config.block_size

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    return draw(B, T, C), draw(B, T, C), [draw(1, L, C) for _ in model.blocks]


def with_impl(case: Case, impl: str) -> Case:
    return dataclasses.replace(case, options={**case.options, "impl": impl})


# ----------------------------------------------------------------------------------------------------------------------
# The checks (plain functions, so that the tests at the end can show that they fail on broken backends)
# ----------------------------------------------------------------------------------------------------------------------


def check_layer_causality(case: Case) -> None:
    """Changing x and the token embeddings from position CUT on leaves the layer's outputs before CUT unchanged."""
    model = build_model(case)
    attn = model.blocks[layer_under_test(model, case)].attn
    x, emb, reference = layer_inputs(model)
    y = attn(x, model.context(T, embeddings=emb, reference=reference))  # (B, T, C)
    x2, emb2 = x.clone(), emb.clone()
    x2[:, CUT:] += torch.randn_like(x2[:, CUT:])
    emb2[:, CUT:] += torch.randn_like(emb2[:, CUT:])
    y2 = attn(x2, model.context(T, embeddings=emb2, reference=reference))
    leak = (y2[:, :CUT] - y[:, :CUT]).abs().max().item()
    assert leak <= 1e-12, f"{case.id}: changing positions >= {CUT} changed earlier outputs by {leak:.3e} (not causal)"
    assert not torch.allclose(y2[:, CUT:], y[:, CUT:]), f"{case.id}: later outputs ignore their own inputs"


def check_model_causality(case: Case) -> None:
    """Changing the tokens from position CUT on leaves the logits before CUT unchanged (reference stream included)."""
    model = build_model(case)
    g = torch.Generator().manual_seed(2)
    V = model.config.vocab_size
    idx = torch.randint(0, V, (B, T), generator=g)
    other = idx.clone()
    other[:, CUT:] = (other[:, CUT:] + torch.randint(1, V, (B, T - CUT), generator=g)) % V
    with torch.no_grad():
        logits, changed = model(idx), model(other)  # (B, T, V)
    leak = (changed[:, :CUT] - logits[:, :CUT]).abs().max().item()
    assert leak <= 1e-12, f"{case.id}: changing tokens >= {CUT} changed earlier logits by {leak:.3e} (not causal)"
    assert not torch.allclose(changed[:, CUT:], logits[:, CUT:]), f"{case.id}: later logits ignore their tokens"


def check_fast_equals_math(case: Case) -> None:
    """impl="sdpa" and impl="math" with the same weights: outputs and every gradient agree to TOL (relative)."""
    fast = build_model(with_impl(case, "sdpa"))
    ref = build_model(with_impl(case, "math"), seed=1)
    ref.load_state_dict(fast.state_dict())
    i = layer_under_test(fast, case)
    x, emb, reference = layer_inputs(fast)
    outputs, grads = [], []
    for model in (fast, ref):
        attn = model.blocks[i].attn
        xi, ei = x.clone().requires_grad_(), emb.clone().requires_grad_()
        ri = [r.clone().requires_grad_() for r in reference]
        y = attn(xi, model.context(T, embeddings=ei, reference=ri))  # (B, T, C)
        y.backward(torch.cos(torch.arange(y.numel(), dtype=torch.float64)).view_as(y))
        outputs.append(y.detach())
        grads.append({"x": xi.grad, "embeddings": ei.grad, "reference": ri[i].grad})
        grads[-1].update({f"param {name}": p.grad for name, p in attn.named_parameters()})
    assert rel(outputs[0], outputs[1]) < TOL, f"{case.id}: forward differs, rel {rel(outputs[0], outputs[1]):.3e}"
    assert grads[0].keys() == grads[1].keys()
    assert grads[0]["x"] is not None, f"{case.id}: no gradient reaches the input"
    for label, ga in grads[0].items():
        gb = grads[1][label]
        assert (ga is None) == (gb is None), f"{case.id}: {label} gets a gradient on one path only"
        if label.startswith("param"):
            assert ga is not None, f"{case.id}: {label} gets no gradient"
        if ga is not None:
            assert torch.isfinite(ga).all(), f"{case.id}: {label} gradient is not finite"
            # absolute floor: a gradient that is zero in exact arithmetic (a key bias under softmax) is rounding noise
            err = (ga - gb).norm().item()
            assert err < TOL * gb.norm().item() + 1e-14, f"{case.id}: {label} gradient differs, rel {rel(ga, gb):.3e}"


def check_fp32_finite(case: Case) -> None:
    """An fp32 model's loss and every parameter's gradient are finite; every parameter gets a gradient."""
    model = build_model(case, dtype=torch.float32).train()
    idx = torch.randint(0, model.config.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(3))
    loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    assert torch.isfinite(loss), f"{case.id}: fp32 loss {loss.item()}"
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), f"{case.id}: {name} gradient missing or not finite"


@functools.lru_cache(maxsize=1)
def text_bytes() -> torch.Tensor:
    """Real English/Python text: the pydoc topics that ship with CPython, as UTF-8 bytes (ids 0..255)."""
    from pydoc_data.topics import topics

    return torch.tensor(list("\n".join(topics[key] for key in sorted(topics)).encode("utf-8")[:300_000]))  # (N,)


def check_learns_bytes(case: Case) -> None:
    """The case's tiny GPT over bytes (fp32, its own init; its layers run the case's backend with the case's options)
    trained by AdamW (lr 3e-3) on LEARN_STEPS batches of 8 windows of T + 1 bytes of real text: every loss is finite
    and the mean of the last 5 is below 0.8 x the first."""
    torch.manual_seed(0)
    model = GPT(model_config(case, vocab_size=257))
    layers = [block.attn for block in model.blocks if type(block.attn).name == case.backend]
    assert layers, f"{case.id}: no layer runs {case.backend!r}"
    for attn, (key, value) in itertools.product(layers, case.options.items()):  # the model trains what was asked
        assert isinstance(value, dict) or getattr(attn.options, key) == value, f"{case.id}: {key} is not {value!r}"
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = text_bytes()
    starts = torch.randint(0, data.numel() - T - 1, (LEARN_STEPS, 8), generator=torch.Generator().manual_seed(0))
    losses = []
    for row in starts.tolist():
        window = torch.stack([data[s : s + T + 1] for s in row])  # (8, T + 1)
        loss = F.cross_entropy(model(window[:, :-1]).flatten(0, 1), window[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses), f"{case.id}: a training loss is not finite: {losses}"
    assert sum(losses[-5:]) / 5 < 0.8 * losses[0], f"{case.id}: the tiny GPT does not learn bytes: {losses}"


def identity_transform_cases(case: Case) -> list[dict[str, Any]]:
    """The identity-at-init transforms that compose with `case` (none if its backend takes no `qk_transform` or the
    case already has one)."""
    cls = attention.get_attention(case.backend)
    if "qk_transform" not in {f.name for f in dataclasses.fields(cls.Options)} or case.options.get("qk_transform"):
        return []
    composable = []
    for spec in IDENTITY_TRANSFORMS:
        try:
            model_config(case).replace(attention_options={**case.options, "qk_transform": spec})
        except ValueError:  # the backend refuses any transform (coupled / uncoupled_mlp: they are one already)
            continue
        composable.append(spec)
    return composable


def check_identity_at_init(case: Case, spec: dict[str, Any]) -> None:
    """Base model + a fresh transform `spec` (at its init) gives the base model's logits; moved, it acts."""
    base = build_model(case)
    composed_case = dataclasses.replace(case, options={**case.options, "qk_transform": spec})
    torch.manual_seed(5)
    composed = GPT(model_config(composed_case)).double().eval()
    missing, unexpected = composed.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and missing and all(".qk_transform." in key for key in missing), (missing, unexpected)
    idx = torch.randint(0, base.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = base(idx)
        got = composed(idx)
        # Grouped K/V heads: the base runs SDPA on nkv heads, the composition on nh transformed keys (other kernels).
        err = (got - want).abs().max().item()
        assert err <= 1e-13, f"{case.id} + {spec}: not the identity at init (max |diff| {err:.3e})"
        for name, p in composed.named_parameters():
            if ".qk_transform." in name:
                p.add_(0.3 * torch.randn_like(p))
        assert not torch.allclose(composed(idx), want), f"{case.id} + {spec}: the transform does not act once trained"


def _row_blocks(linear: nn.Linear, n_blocks: int) -> Iterator[tuple[int, list[torch.Tensor]]]:
    """(block b, the views of weight / bias rows of block b) for the n_blocks equal row blocks of `linear`."""
    rows = linear.out_features // n_blocks
    for b in range(n_blocks):
        views = [linear.weight[b * rows : (b + 1) * rows]]
        if linear.bias is not None:
            views.append(linear.bias[b * rows : (b + 1) * rows])
        yield b, views


def changed_maps(attn: AttentionBackend, x, ctx, logits: torch.Tensor, tensors: list[torch.Tensor]) -> set[int]:
    """The logit maps that change when `tensors` (views of parameters) are perturbed; the values are restored."""
    saved = [t.clone() for t in tensors]
    with torch.no_grad():
        for t in tensors:
            t.add_(0.5 * torch.randn_like(t))
        after = attn.attention_logits(x, ctx)
        for t, s in zip(tensors, saved, strict=True):
            t.copy_(s)
    diff = (after - logits).nan_to_num(0.0).abs().amax(dim=(0, 2, 3))  # (n_maps,) (-inf - -inf is nan: masked)
    return {h for h, d in enumerate(diff.tolist()) if d > 1e-12}


def check_qk_seam(case: Case) -> None:
    """`qk_weights()` states the matrices whose row blocks make each head's logits; the groups agree with the logits."""
    model = build_model(case)
    attn = model.blocks[layer_under_test(model, case)].attn
    x, emb, reference = layer_inputs(model)
    ctx = model.context(T, embeddings=emb, reference=reference)
    for name, _ in attn.named_parameters():
        assert attn.parameter_group(name) in GROUPS, f"{case.id}: {name} in unknown group {attn.parameter_group(name)}"
    with torch.no_grad():
        logits = attn.attention_logits(x, ctx)
    spec = attn.qk_weights()
    if logits is None:
        assert spec is None, f"{case.id}: states Q/K weights but has no softmax logits (QK-clip reads them)"
        return
    n_maps = logits.size(1)
    assert logits.dtype == torch.float64 and logits.shape[0] in (1, B) and logits.shape[2:] == (T, T)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    assert torch.isneginf(logits[..., future]).all(), f"{case.id}: future logits are not -inf"
    assert torch.isfinite(logits[..., ~future]).all(), f"{case.id}: past logits are not finite"
    for name, p in attn.named_parameters():  # value and output weights never move a logit
        if attn.parameter_group(name) in ("v", "out"):
            assert not changed_maps(attn, x, ctx, logits, [p]), f"{case.id}: {name} (not Q/K) changes the logits"
    if spec is None:
        return
    query = spec.weights[0] if spec.rule == "mha" else next(w for w in spec.weights if w.role == "uq")
    assert query.n_blocks == n_maps, f"{case.id}: {n_maps} logit maps but {query.n_blocks} query blocks"
    for w in spec.weights:
        linear = attn.get_submodule(w.name)
        assert isinstance(linear, nn.Linear), f"{case.id}: {w.name} is not an nn.Linear"
        assert linear.out_features % w.n_blocks == 0 and n_maps % w.n_blocks == 0, (case.id, w)
        for name in ("weight", "bias"):
            if getattr(linear, name) is not None:
                group = attn.parameter_group(f"{w.name}.{name}")
                assert group == ("q" if w.role in ("q", "dq", "uq", "qr") else "k"), (case.id, w.name, group)
        per_block = n_maps // w.n_blocks
        for b, views in _row_blocks(linear, w.n_blocks):
            moved = changed_maps(attn, x, ctx, logits, views)
            heads = set(range(b * per_block, (b + 1) * per_block))
            assert moved, f"{case.id}: block {b} of {w.name} ({w.role}) changes no logit: it does not feed the scores"
            assert moved <= heads, f"{case.id}: block {b} of {w.name} ({w.role}) changes maps {moved}, not {heads}"


def check_decode_parity(case: Case) -> None:
    """Token by token from an empty cache, prefills of 1 and 6 tokens then one token at a time, in chunks and in one
    shot: the logits equal the full forward's to TOL (absolute)."""
    model = build_model(case)
    idx = torch.randint(0, model.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(1))
    schedules = {
        "token-by-token": [1] * T,
        "prefill-6": [6] + [1] * (T - 6),
        "chunked": [3, 4, 1, 2, 2],
        "one-shot": [T],
    }
    with torch.no_grad():
        full = model(idx)  # (B, T, V)
        for label, chunks in schedules.items():
            cache = model.new_cache(B, T)
            outs, start = [], 0
            for n in chunks:
                outs.append(model(idx[:, start : start + n], cache=cache))  # (B, n, V)
                start += n
            assert cache.length == T
            err = (torch.cat(outs, dim=1) - full).abs().max().item()
            assert err < TOL, f"{case.id} {label}: max |decoded - full| = {err:.3e}"


# ----------------------------------------------------------------------------------------------------------------------
# Coverage: every registered backend, every advertised option value has a case
# ----------------------------------------------------------------------------------------------------------------------


def _choices(hint: Any) -> tuple[Any, ...]:
    """The values a field's type annotation enumerates: a Literal's, or (False, True) for bool; () otherwise."""
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    return (False, True) if hint is bool else ()


def _enumerated(options_class: type) -> Iterator[tuple[str, Any]]:
    hints = typing.get_type_hints(options_class)
    for f in dataclasses.fields(options_class):
        if f.name != "impl":  # both impls run in every case (fast path == math path)
            for value in _choices(hints[f.name]):
                yield f.name, value


def _accepted(name: str, options: dict[str, Any]) -> bool:
    try:
        attention.validate_attention(name, options, model_config(Case(name)), 0)
    except ValueError:
        return False
    return True


def _takes_transform(name: str) -> bool:
    return "qk_transform" in {f.name for f in dataclasses.fields(attention.get_attention(name).Options)}


def advertised(name: str) -> list[tuple[str, dict[str, Any]]]:
    """(what, minimal options) for every option value of backend `name` (and every q/k transform kind it composes
    with) that it advertises and accepts on its own."""
    cls = attention.get_attention(name)
    wanted = [(f"option {field}={value!r}", {field: value}) for field, value in _enumerated(cls.Options)]
    if _takes_transform(name):
        wanted += [(f"qk_transform kind {kind!r}", {"qk_transform": {"kind": kind}}) for kind in transform_registry()]
    return [(what, options) for what, options in wanted if _accepted(name, options)]


def _transform_options(case: Case) -> tuple[str, Any] | None:
    """(kind, parsed transform options) of a case's explicit `qk_transform`, None without one."""
    spec = case.options.get("qk_transform")
    if not spec:
        return None
    transform = transform_registry()[spec["kind"]]
    return spec["kind"], transform.Options(**{k: v for k, v in spec.items() if k != "kind"})


def coverage_gaps(cases: list[Case]) -> list[str]:
    """One message per registered backend without a case, per advertised option value (or transform kind) of a
    backend that none of its cases uses, and per transform option value that no case's `qk_transform` uses."""
    gaps = []
    for name in attention.available():
        cls = attention.get_attention(name)
        mine = [cls.parse_options(case.options) for case in cases if case.backend == name]
        if not mine:
            gaps.append(
                f"attention backend {name!r} is registered but has no case: add Case({name!r}, {{...}}) to CASES in "
                "tests/backend_cases.py (the contract harness then checks it)."
            )
            continue
        for what, wanted in advertised(name):
            ((field, value),) = wanted.items()
            if field == "qk_transform":
                used = any((o.qk_transform or {}).get("kind") == value["kind"] for o in mine)
            else:
                used = any(getattr(o, field) == value for o in mine)
            if not used:
                gaps.append(
                    f"attention backend {name!r}: {what} appears in no case: add e.g. Case({name!r}, {wanted!r}) to "
                    "CASES in tests/backend_cases.py."
                )
    hosts = [name for name in attention.available() if _takes_transform(name)]
    used = [t for t in map(_transform_options, cases) if t is not None]
    for kind, transform in transform_registry().items():
        for field, value in _enumerated(transform.Options):
            spec = {"kind": kind, field: value}
            if not any(_accepted(host, {"qk_transform": spec}) for host in hosts):
                continue
            if not any(k == kind and getattr(options, field) == value for k, options in used):
                gaps.append(
                    f"q/k transform {kind!r}: option {field}={value!r} appears in no case: add e.g. "
                    f"Case({hosts[0]!r}, {{'qk_transform': {spec!r}}}) to CASES in tests/backend_cases.py."
                )
    return gaps


# ----------------------------------------------------------------------------------------------------------------------
# The tests
# ----------------------------------------------------------------------------------------------------------------------


def test_every_backend_and_advertised_option_has_a_case():
    gaps = coverage_gaps(CASES)
    assert not gaps, "\n".join(gaps)
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids)), f"duplicate case ids: {sorted({i for i in ids if ids.count(i) > 1})}"


@pytest.mark.parametrize("case", case_params())
def test_layer_is_causal(case: Case):
    check_layer_causality(case)


@pytest.mark.parametrize("case", case_params())
def test_model_is_causal(case: Case):
    check_model_causality(case)


@pytest.mark.parametrize("case", case_params())
def test_fast_path_equals_math_path_fp64(case: Case):
    check_fast_equals_math(case)


@pytest.mark.parametrize("case", case_params())
def test_fp32_forward_and_backward_are_finite(case: Case):
    check_fp32_finite(case)


@pytest.mark.parametrize("case", case_params())
def test_tiny_gpt_learns_bytes(case: Case):
    check_learns_bytes(case)


@pytest.mark.parametrize("case", case_params([case for case in CASES if identity_transform_cases(case)]))
def test_identity_transforms_leave_the_model_unchanged_at_init(case: Case):
    for spec in identity_transform_cases(case):
        check_identity_at_init(case, spec)


@pytest.mark.parametrize("case", case_params())
def test_qk_seam(case: Case):
    check_qk_seam(case)


@pytest.mark.parametrize("case", case_params(decode=True))
def test_decode_equals_full_forward(case: Case):
    check_decode_parity(case)


# ----------------------------------------------------------------------------------------------------------------------
# The checks fail on broken backends
# ----------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _DummyOptions(AttentionOptions):
    mode: Literal["plain", "exotic"] = "plain"


class _Dummy(AttentionBackend):
    """Plain causal MHA without RoPE; `leak` makes it see the next token, `skew` puts a wrong scale on its SDPA path,
    `misstated` states its Q/K rows wrongly."""

    name = "dummy_contract"
    Options = _DummyOptions
    leak = False
    skew = 1.0
    misstated = False

    def __init__(self, config, layer_idx, options) -> None:
        super().__init__(config, layer_idx, options)
        C, self.nh = config.n_embd, config.n_head
        self.qkv = nn.Linear(C, 3 * C, bias=False)
        self.out_proj = nn.Linear(C, C, bias=False)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        if self.leak:
            x = x + torch.roll(x, -1, dims=1)  # position t sees t + 1
        q, k, v = (t.unflatten(-1, (self.nh, -1)).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))  # (B, nh, T, hs)
        scale = self.skew / q.size(-1) ** 0.5 if self.options.impl == "sdpa" else None
        y = causal_attention(q, k, v, impl=self.options.impl, scale=scale)  # (B, nh, T, hs)
        return self.out_proj(y.transpose(1, 2).flatten(2))  # (B, T, C)

    def attention_logits(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        q, k, _ = (t.unflatten(-1, (self.nh, -1)).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        return causal_logits(q, k)  # (B, nh, T, T)

    def qk_weights(self) -> QKWeights | None:
        """Wrong on purpose when `misstated`: the fused qkv matrix is not one row block per head."""
        return QKWeights("mha", (QKWeight("qkv", "qk", self.nh),)) if self.misstated else None


def _register(monkeypatch, cls: type[AttentionBackend]) -> None:
    monkeypatch.setitem(attention.ATTENTION_BACKENDS, cls.name, cls)


def test_a_registered_backend_without_a_case_fails_the_coverage_check(monkeypatch):
    _register(monkeypatch, _Dummy)
    gaps = coverage_gaps(CASES)
    assert len(gaps) == 1 and "'dummy_contract' is registered but has no case" in gaps[0], gaps
    gaps = coverage_gaps([*CASES, Case("dummy_contract", {})])  # a case, but not for the advertised "exotic"
    assert len(gaps) == 1 and "dummy_contract" in gaps[0] and "mode='exotic'" in gaps[0], gaps
    assert not coverage_gaps([*CASES, Case("dummy_contract", {}), Case("dummy_contract", {"mode": "exotic"})])


def test_an_uncovered_transform_kind_fails_the_coverage_check():
    without = [
        c for c in CASES if not (c.backend == "mla" and c.options.get("qk_transform", {}).get("kind") == "coupled")
    ]
    assert any("'mla': qk_transform kind 'coupled' appears in no case" in gap for gap in coverage_gaps(without))


def test_the_causality_checks_catch_a_backend_that_sees_the_future(monkeypatch):
    leaky = type("_Leaky", (_Dummy,), {"name": "dummy_leaky", "leak": True})
    _register(monkeypatch, leaky)
    with pytest.raises(AssertionError, match="not causal"):
        check_layer_causality(Case("dummy_leaky", {}, {"position": "none"}))
    with pytest.raises(AssertionError, match="not causal"):
        check_model_causality(Case("dummy_leaky", {}, {"position": "none"}))
    _register(monkeypatch, _Dummy)
    check_layer_causality(Case("dummy_contract", {}, {"position": "none"}))  # the same backend without the leak


def test_the_fast_path_check_catches_a_wrong_sdpa_path(monkeypatch):
    skewed = type("_Skewed", (_Dummy,), {"name": "dummy_skewed", "skew": 1.001})
    _register(monkeypatch, skewed)
    with pytest.raises(AssertionError, match="forward differs"):
        check_fast_equals_math(Case("dummy_skewed", {}, {"position": "none"}))
    _register(monkeypatch, _Dummy)
    check_fast_equals_math(Case("dummy_contract", {}, {"position": "none"}))


def test_the_seam_check_catches_misstated_qk_rows(monkeypatch):
    misstated = type("_Misstated", (_Dummy,), {"name": "dummy_misstated", "misstated": True})
    _register(monkeypatch, misstated)
    with pytest.raises(AssertionError, match="block 0 of qkv"):
        check_qk_seam(Case("dummy_misstated", {}, {"position": "none"}))
    _register(monkeypatch, _Dummy)
    check_qk_seam(Case("dummy_contract", {}, {"position": "none"}))  # states nothing: nothing to contradict


def test_the_learning_check_catches_a_backend_that_breaks_training(monkeypatch):
    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        return _Dummy.forward(self, x, ctx) * float("nan")

    _register(monkeypatch, type("_Broken", (_Dummy,), {"name": "dummy_broken", "forward": forward}))
    with pytest.raises(AssertionError, match="not finite"):
        check_learns_bytes(Case("dummy_broken", {}, {"position": "none"}))
    _register(monkeypatch, _Dummy)
    check_learns_bytes(Case("dummy_contract", {}, {"position": "none"}))
