"""The contract every attention backend keeps, checked for every case of `backend_cases.CASES` (one harness).

The checks are the package's (`lightning_cqk/contract/checks.py`, the code `lightning_cqk check-backend` runs on any
backend); this file runs them over the built-in cases, adds the identity-at-init of the built-in q/k transforms and
the coverage check, and shows that the checks fail on broken backends.

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
- batch rows independent, deterministic (the same seed twice), bf16 autocast finite, the state dict round-trips: on
  the first case of each backend (they do not depend on the options);
- learning: the tiny GPT over bytes (fp32, its own init) learns real text: 40 AdamW steps take the loss below 0.8 x
  its start (the check each backend's test file used to copy).

Coverage: a registered backend without a case, or an advertised option value (see `backend_cases`) without one,
fails `test_every_backend_and_advertised_option_has_a_case` with a message naming it. Tests below show that the
coverage check and the causality, fast-path, seam and learning checks can fail (dummy backends registered for the test).
"""

from __future__ import annotations

import dataclasses
import itertools
import typing
from collections.abc import Iterator
from typing import Any, Literal

import pytest
import torch
from backend_cases import CASES, Case, build_model, case_params, model_config
from torch import nn

from lightning_cqk import attention
from lightning_cqk.attention import AttentionBackend, AttentionContext, AttentionOptions
from lightning_cqk.attention.base import QKWeight, QKWeights
from lightning_cqk.attention.kernels.functional import causal_attention, causal_logits
from lightning_cqk.attention.transform import transform_registry
from lightning_cqk.contract.cases import B, T
from lightning_cqk.contract.checks import (
    NotApplicable,
    check_batch_rows,
    check_bf16_autocast,
    check_decode_parity,
    check_deterministic,
    check_fast_equals_math,
    check_flops,
    check_fp32_finite,
    check_layer_causality,
    check_learns_bytes,
    check_model_causality,
    check_qk_seam,
    check_state_dict,
)
from lightning_cqk.model import GPT

#: q/k transforms that are the identity at init (v2 by its zero last layer; v1 with dt = 0).
IDENTITY_TRANSFORMS = [
    {"kind": "invertible"},
    {"kind": "invertible", "rope_order": "post", "share_heads": True},
    {"kind": "invertible", "additive": True, "fused": False, "layers": 3},
    {"kind": "coupled", "dt_param": "raw", "dt_init": 0.0, "steps": 2},
    {"kind": "uncoupled_mlp", "dt_param": "raw", "dt_init": 0.0, "rope_order": "post"},
]
#: One case per backend: the checks that do not depend on the options (rows, determinism, bf16, state dict) run on it.
FIRST_CASE: dict[str, Case] = {}
for _case in CASES:
    FIRST_CASE.setdefault(_case.backend, _case)


def noted(check: typing.Callable[[Case], str], case: Case) -> str:
    """Run a check; a check that cannot apply to the case (`NotApplicable`) has held trivially: its note is returned."""
    try:
        return check(case)
    except NotApplicable as note:
        return f"n/a: {note}"


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
    noted(check_fast_equals_math, case)


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
    noted(check_qk_seam, case)


@pytest.mark.parametrize("case", case_params(decode=True))
def test_decode_equals_full_forward(case: Case):
    assert not check_decode_parity(case).startswith("n/a"), "every built-in decodes with a cache"


@pytest.mark.parametrize("backend", sorted(FIRST_CASE))
def test_rows_determinism_bf16_state_dict_and_flops(backend: str):
    for check in (check_batch_rows, check_deterministic, check_bf16_autocast, check_state_dict, check_flops):
        check(FIRST_CASE[backend])


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


def test_the_harness_runs_the_check_backend_command_s_checks():
    """One implementation: every check this harness runs is a row of `lightning_cqk check-backend`."""
    from lightning_cqk.contract.check_backend import CHECKS

    rows = {check for _, check in CHECKS}
    harness = [check_layer_causality, check_model_causality, check_fast_equals_math, check_fp32_finite, check_qk_seam]
    harness += [check_decode_parity, check_learns_bytes, check_batch_rows, check_deterministic, check_bf16_autocast]
    assert all(check in rows for check in [*harness, check_state_dict, check_flops])


def test_check_backend_fails_a_leaky_backend_naming_causality(monkeypatch, capsys):
    from lightning_cqk.contract.check_backend import check_backend_command

    _register(monkeypatch, type("_Leaky", (_Dummy,), {"name": "dummy_leaky", "leak": True}))
    with pytest.raises(SystemExit) as done:
        check_backend_command(["dummy_leaky", "--config", '{"position": "none"}'])
    assert done.value.code == 1
    table = capsys.readouterr().out
    for row in ("causality (layer)", "causality (model)"):
        line = next(line for line in table.splitlines() if line.startswith(row))
        assert " FAIL " in line and "not causal" in line, line
    assert "no cache: generate recomputes" in table  # the dummy defines no new_cache: a note, not a failure
    assert "failed" in table.splitlines()[-1]


def test_check_backend_shows_a_constructor_that_raises_as_the_failing_row(monkeypatch):
    from lightning_cqk.contract.check_backend import run_checks

    def broken_init(self, config, layer_idx, options):
        raise RuntimeError("no weights for you\nsecond line")

    _register(monkeypatch, type("_NoInit", (_Dummy,), {"name": "dummy_noinit", "__init__": broken_init}))
    rows = run_checks(Case("dummy_noinit", {}, {"position": "none"}))
    assert (rows[0].check, rows[0].result, rows[0].detail) == (
        "builds",
        "FAIL",
        "raised RuntimeError: no weights for you",
    )
    assert {row.result for row in rows[1:]} == {"not run"}


def test_the_determinism_check_catches_a_backend_with_hidden_state(monkeypatch):
    calls = itertools.count()

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        return _Dummy.forward(self, x, ctx) * (1 + 1e-3 * next(calls))  # state outside the seeded RNG

    _register(monkeypatch, type("_Noisy", (_Dummy,), {"name": "dummy_noisy", "forward": forward}))
    with pytest.raises(AssertionError, match="the same seed gave other outputs"):
        check_deterministic(Case("dummy_noisy", {}, {"position": "none"}))
    _register(monkeypatch, _Dummy)
    check_deterministic(Case("dummy_contract", {}, {"position": "none"}))


def test_the_batch_check_catches_rows_that_see_each_other(monkeypatch):
    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        return _Dummy.forward(self, x, ctx) + x.mean(0, keepdim=True)  # every row sees the batch mean

    _register(monkeypatch, type("_Mixing", (_Dummy,), {"name": "dummy_mixing", "forward": forward}))
    with pytest.raises(AssertionError, match="rows not independent"):
        check_batch_rows(Case("dummy_mixing", {}, {"position": "none"}))
