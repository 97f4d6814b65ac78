"""The one list of (backend, options) cases that every backend-generic test runs over.

The contract harness (`tests/contract/test_contract.py`: causality, fast path == math path in fp64, identity at init of
the q/k transforms, the Q/K seam, decode parity) and the decode tests (`tests/unit/model/test_decode*.py`: left padding,
cache bytes, narrower caches) all parametrize over `CASES`. A backend's own test file checks only what is specific to it
(its equations against a loop, degenerate cases, parameter counts, ...); the generic checks live in the harness.

Add a backend or an option value: append a `Case` (the backend's registry name, its options, optionally overrides of
the tiny test model's config: position encoding, bias, hybrid `layer_overrides`). The harness fails, naming what is
missing, when a registered backend has no case, or when an option value its `Options` advertise (every value of a
`Literal` or `bool` field, every q/k transform kind, every value of a transform's `Literal` / `bool` options) that
`validate_attention` accepts appears in no case.

`owner` marks a backend whose decode path has not landed yet: its decode cases are strict xfails
(NotImplementedError from `AttentionBackend.new_cache`) naming who implements it; the owner removes `owner=` when the
backend decodes (a strict xfail that passes fails the suite, so a forgotten mark is caught).

`Case`, `model_config` and `build_model` live in the package (`lightning_cqk/contract/cases.py`), with the checks
themselves (`lightning_cqk/contract/checks.py`): `lightning_cqk check-backend` runs the same code on any backend.
This file is importable from every test folder (`tests/` is on sys.path through the root conftest).
"""

from __future__ import annotations

from typing import Any

import pytest

from lightning_cqk.contract.cases import BASE_CONFIG, Case, build_model, model_config  # noqa: F401 - for the tests

_INVERTIBLE = {"kind": "invertible"}
_COUPLED = {"kind": "coupled"}
_UNCOUPLED = {"kind": "uncoupled_mlp"}

#: The per-head q/k mechanisms the transform stage composes with, and one spec of each transform kind (small
#: hidden widths; the two v2 specs cover rope_order, share_heads and the unfused reference).
_COMPOSITIONS = [
    ("standard", {}),
    ("standard", {"qkv_sharing": "k_eq_v"}),
    ("standard", {"qkv_sharing": "q_eq_k", "qk_norm": True}),
    ("standard", {"n_kv_groups": 2}),
    ("standard", {"n_kv_groups": 1, "qkv_sharing": "k_eq_v"}),
    ("differential", {}),
    ("mla", {}),
    ("mla", {"qk_norm": True}),
]
_TRANSFORMS = [
    {"kind": "coupled", "hidden": 5},
    {"kind": "uncoupled_mlp", "hidden": 5, "rope_order": "post"},
    {"kind": "invertible", "hidden": 3},
    {"kind": "invertible", "hidden": 3, "rope_order": "post", "share_heads": True, "fused": False},
]
#: Every qkv_sharing x n_kv_groups setting of `standard` (arXiv 2606.04032) at 4 heads.
_SHARING = [
    ("none", 2),
    ("none", 1),
    ("k_eq_v", None),
    ("k_eq_v", 2),
    ("k_eq_v", 1),
    ("q_eq_k", None),
    ("q_eq_k_eq_v", None),
]


def _grouping(sharing: str, groups: int | None) -> dict[str, Any]:
    return {"qkv_sharing": sharing, **({} if groups is None else {"n_kv_groups": groups})}


CASES: list[Case] = [
    # standard: every sharing x grouping setting, with and without QK-norm, both impls, every position encoding
    Case("standard", {}),
    Case("standard", {"impl": "math"}),
    Case("standard", {"qk_norm": True}),
    *[Case("standard", {**_grouping(s, g), "qk_norm": n}, {"bias": n}) for s, g in _SHARING for n in (False, True)],
    Case("standard", {"qkv_sharing": "q_eq_k_eq_v", "qk_norm": True, "impl": "math"}),
    Case("standard", {"n_kv_groups": 2, "qkv_sharing": "k_eq_v", "impl": "math"}),
    Case("standard", {"qkv_sharing": "k_eq_v"}, {"position": "learned"}, name="standard-k_eq_v-learned"),
    Case("standard", {"n_kv_groups": 2}, {"position": "none"}, name="standard-gqa-nopos"),
    Case("standard", {"qk_norm": True}, {"bias": True}, name="standard-qk_norm-bias"),
    # the q/k transform stage on every per-head mechanism, every kind (and the decode-relevant rope_order / tying)
    *[Case(b, {**o, "qk_transform": t}) for b, o in _COMPOSITIONS for t in _TRANSFORMS],
    Case("standard", {"qk_transform": _INVERTIBLE, "n_kv_groups": 2}),
    Case("standard", {"qk_transform": {**_INVERTIBLE, "rope_order": "post"}, "qkv_sharing": "k_eq_v"}),
    Case("standard", {"qk_transform": {**_INVERTIBLE, "additive": True, "layers": 3, "scale_clamp": None}}),
    Case("standard", {"qk_transform": {**_INVERTIBLE, "share_layers": True}, "qk_norm": True}),
    Case("standard", {"qk_transform": _COUPLED, "qkv_sharing": "q_eq_k_eq_v", "qk_norm": True}),
    Case("standard", {"qk_transform": {**_UNCOUPLED, "rope_order": "post"}, "qkv_sharing": "q_eq_k"}),
    Case("standard", {"qk_transform": {**_UNCOUPLED, "zero_init_last": True, "g_k_output_bias": True}}),
    Case("standard", {"qk_transform": {**_COUPLED, "gradient_field": True, "zero_init_last": True, "steps": 2}}),
    # the v1 names (standard + the v1 transform under flat options)
    Case("coupled", {}),
    Case("coupled", {"integrator": "euler", "steps": 2, "rope_order": "post", "n_kv_groups": 2, "impl": "math"}),
    Case("coupled", {"gradient_field": True, "dt_scope": "head", "qkv_sharing": "k_eq_v"}),
    Case("coupled", {"integrator": "euler", "rope_order": "post", "dt_scope": "head", "steps": 3}),
    Case("coupled", {"gradient_field": True, "qk_norm": True, "steps": 2, "share_dynamics": "layer"}),
    Case("coupled", {"dt_param": "exp", "hidden": 5, "recompute": "qk"}),
    Case("coupled", {"dt_param": "raw", "zero_init_last": True, "recompute": "none"}),
    Case("coupled", {"qkv_sharing": "q_eq_k", "qk_norm": True}),
    Case("coupled", {"qkv_sharing": "q_eq_k_eq_v", "recompute": "qk"}),
    Case("uncoupled_mlp", {}),
    Case("uncoupled_mlp", {"rope_order": "post", "qk_norm": True}),
    Case("uncoupled_mlp", {"steps": 3, "dt_scope": "head", "rope_order": "post", "qk_norm": True, "hidden": 7}),
    Case("uncoupled_mlp", {"qkv_sharing": "k_eq_v", "n_kv_groups": 2, "recompute": "qk", "dt_param": "exp"}),
    Case("uncoupled_mlp", {"qkv_sharing": "q_eq_k", "share_dynamics": "layer", "dt_param": "raw"}),
    Case("uncoupled_mlp", {"qkv_sharing": "q_eq_k_eq_v", "zero_init_last": True, "recompute": "none"}),
    Case("uncoupled_mlp", {"g_k_output_bias": True}),
    # differential
    Case("differential", {}),
    Case("differential", {"impl": "math", "qk_norm": True, "lambda_init": 0.5}),
    Case("differential", {"qk_norm": True}),
    Case("differential", {"n_kv_groups": 2}),
    Case("differential", {"n_kv_groups": 2, "qk_transform": _COUPLED}),  # a recipe option (issue 17)
    Case("differential", {"qk_transform": {**_INVERTIBLE, "rope_order": "post"}, "n_kv_groups": 2, "impl": "math"}),
    Case("differential", {"qk_transform": _COUPLED}, {"position": "learned"}, name="differential-coupled-learned"),
    # mla (absorbed latent cache; qk_norm adds a key scale per head; a q/k transform caches the transformed keys)
    Case("mla", {}),
    Case("mla", {"impl": "math"}, {"bias": True}, name="mla-math-bias"),
    Case("mla", {"impl": "math", "qk_norm": True}),
    Case("mla", {"latent_norm": False, "d_nope": 4, "d_rope": 4}),  # q/k and v head sizes equal: no padding
    Case("mla", {"d_rope": 4, "d_nope": 6, "d_v": 12, "d_cq": 16, "d_ckv": 10}),  # sub-sampled RoPE tables
    Case("mla", {"d_rope": 6, "qk_norm": True}),  # d_rope does not divide hs: tables built for d_rope
    Case("mla", {"qk_norm": True, "latent_norm": False}, {"bias": True}, name="mla-qk_norm-nolatentnorm-bias"),
    Case("mla", {"d_rope": 6, "d_nope": 5, "d_v": 7, "d_ckv": 9, "d_cq": 0}),  # d_rope not dividing hs = 8
    Case("mla", {"d_cq": 0}),  # no query latent: five Q/K matrices
    Case("mla", {"d_rope": 4}),  # every second column of the model's RoPE tables
    Case("mla", {"qk_norm": True}, {"position": "learned"}, name="mla-qk_norm-learned"),
    Case("mla", {"qk_transform": _INVERTIBLE}),
    Case("mla", {"qk_norm": True, "qk_transform": {**_COUPLED, "rope_order": "post"}}),
    Case("mla", {"d_cq": 0, "qk_transform": _COUPLED}),  # a recipe option (issue 17)
    Case("mla", {"prefill": "absorbed"}),  # multi-token chunks in the absorbed form too
    Case("mla", {"prefill": "absorbed", "qk_norm": True}, {"bias": True}, name="mla-absorbed-qk_norm-bias"),
    # the deconstructed variants (arXiv 2510.11602); small chunks so that several chunks and scan levels run
    Case("mlp", {}),
    Case("mlp", {"hidden": 24}),
    Case("approximate", {}),
    Case("approximate", {"normalization": "separate", "chunk_size": 3, "qk_norm": True}),
    Case("approximate", {"normalization": "separate", "chunk_size": 4, "recompute": False}),
    Case("approximate", {"normalization": "joint", "chunk_size": 5}),
    Case("approximate", {"normalization": "joint", "chunk_size": 4, "qk_norm": True}),
    Case("approximate", {"impl": "math"}, {"position": "learned"}, name="approximate-math-learned"),
    Case("non_approximate", {}),
    Case("non_approximate", {"chunk_size": 2, "qk_norm": True}),
    Case("non_approximate", {"chunk_size": 4, "qk_norm": True}),
    Case("static_emb_qk", {}),
    Case("static_emb_qk", {"embedding_norm": False, "qk_norm": True, "impl": "math"}),
    Case("static_emb_qk", {"embedding_norm": False}, {"position": "learned"}, name="static_emb_qk-raw-learned"),
    Case("rnd_emb_qk", {}),
    Case("rnd_emb_qk", {"qk_norm": True, "length": 12}, {"position": "learned"}, name="rnd_emb_qk-L12-learned"),
    Case("rnd_emb_qk", {"detach_reference": True, "sigma": 0.5}),
    Case("fixed_seq_qk", {}),
    Case("fixed_seq_qk", {"qk_norm": True, "impl": "math"}),
    Case("fixed_seq_qk", {"detach_reference": True}, {"position": "none"}, name="fixed_seq_qk-detach-nopos"),
    # hybrids (several backends in one model: the decode and model-level checks see them together)
    Case(
        "approximate",
        {},
        {"n_layer": 3, "layer_overrides": [{"pattern": "even", "attention": "standard"}]},
        name="hybrid-approximate-even-standard",
    ),
    Case(
        "fixed_seq_qk",
        {},
        {"n_layer": 3, "layer_overrides": [{"pattern": "odd", "attention": "mla"}]},
        name="hybrid-fixed_seq_qk-odd-mla",
    ),
]


def case_params(cases: list[Case] | None = None, *, decode: bool = False) -> list[Any]:
    """`cases` (default `CASES`) as pytest params; with `decode`, pending backends' cases are strict xfails."""
    params = []
    for case in CASES if cases is None else cases:
        marks = []
        if decode and case.owner is not None:
            reason = f"decode path of {case.backend!r} not implemented yet (owner: {case.owner})"
            marks.append(pytest.mark.xfail(raises=NotImplementedError, strict=True, reason=reason))
        params.append(pytest.param(case, id=case.id, marks=marks))
    return params
