"""The one list of (backend, options) cases every decode test runs over (`tests/inference`).

Add a case by appending a `Case` to `CASES`: the backend's registry name, its options, and (optionally) overrides of
the tiny test model's config (position encoding, head count, hybrid `layer_overrides`, ...). `owner` marks a backend
whose decode path has not landed yet: its cases are strict xfails (NotImplementedError from
`AttentionBackend.new_cache`) naming who implements it; the owner removes `owner=` when the backend decodes (a strict
xfail that passes fails the suite, so a forgotten mark is caught).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from lightning_cqk.config import ModelConfig
from lightning_cqk.model.gpt import GPT

#: The tiny model every case builds (fp64): 2 layers, width 32, 4 heads of 8, a 16-token context.
BASE_CONFIG = dict(n_layer=2, n_head=4, n_embd=32, mlp_hidden=64, block_size=16, vocab_size=61)


@dataclass(frozen=True)
class Case:
    """One decode test case: `backend` with `options` in every layer, `config` overrides, `owner` while pending."""

    backend: str
    options: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    owner: str | None = None
    name: str = ""

    @property
    def id(self) -> str:
        return self.name or "-".join([self.backend, *(f"{k}={v}" for k, v in self.options.items())])


_INVERTIBLE = {"kind": "invertible"}
_COUPLED = {"kind": "coupled"}
_UNCOUPLED = {"kind": "uncoupled_mlp"}

CASES: list[Case] = [
    # standard: every sharing mode x grouping, QK-norm, both impls, every position encoding
    Case("standard", {}),
    Case("standard", {"impl": "math"}),
    Case("standard", {"qkv_sharing": "k_eq_v"}),
    Case("standard", {"qkv_sharing": "q_eq_k", "qk_norm": True}),
    Case("standard", {"qkv_sharing": "q_eq_k_eq_v"}),
    Case("standard", {"qkv_sharing": "q_eq_k_eq_v", "qk_norm": True, "impl": "math"}),
    Case("standard", {"n_kv_groups": 2, "qk_norm": True}),
    Case("standard", {"n_kv_groups": 1, "qkv_sharing": "k_eq_v", "qk_norm": True}),
    Case("standard", {"n_kv_groups": 2, "qkv_sharing": "k_eq_v", "impl": "math"}),
    Case("standard", {"qkv_sharing": "k_eq_v"}, {"position": "learned"}, name="standard-k_eq_v-learned"),
    Case("standard", {"n_kv_groups": 2}, {"position": "none"}, name="standard-gqa-nopos"),
    # the q/k transform stage on standard: every kind, grouped heads, tied q/k/v, rope_order
    Case("standard", {"qk_transform": _INVERTIBLE, "n_kv_groups": 2}),
    Case("standard", {"qk_transform": {**_INVERTIBLE, "rope_order": "post"}, "qkv_sharing": "k_eq_v"}),
    Case("standard", {"qk_transform": _COUPLED, "qkv_sharing": "q_eq_k_eq_v", "qk_norm": True}),
    Case("standard", {"qk_transform": {**_UNCOUPLED, "rope_order": "post"}, "qkv_sharing": "q_eq_k"}),
    # the v1 names
    Case("coupled", {}),
    Case("coupled", {"integrator": "euler", "steps": 2, "rope_order": "post", "n_kv_groups": 2, "impl": "math"}),
    Case("coupled", {"gradient_field": True, "dt_scope": "head", "qkv_sharing": "k_eq_v"}),
    Case("uncoupled_mlp", {}),
    Case("uncoupled_mlp", {"rope_order": "post", "qk_norm": True}),
    # differential
    Case("differential", {}),
    Case("differential", {"impl": "math", "qk_norm": True, "lambda_init": 0.5}),
    Case("differential", {"n_kv_groups": 2}),
    Case("differential", {"qk_transform": {**_INVERTIBLE, "rope_order": "post"}, "n_kv_groups": 2, "impl": "math"}),
    Case("differential", {"qk_transform": _COUPLED}, {"position": "learned"}, name="differential-coupled-learned"),
    # mla (absorbed latent cache; qk_norm adds a key scale per head; a q/k transform caches the transformed keys)
    Case("mla", {}),
    Case("mla", {"impl": "math"}, {"bias": True}, name="mla-math-bias"),
    Case("mla", {"impl": "math", "qk_norm": True}),
    Case("mla", {"qk_norm": True, "latent_norm": False}, {"bias": True}, name="mla-qk_norm-nolatentnorm-bias"),
    Case("mla", {"d_rope": 6, "d_nope": 5, "d_v": 7, "d_ckv": 9, "d_cq": 0}),  # d_rope not dividing hs = 8
    Case("mla", {"d_rope": 4}),  # every second column of the model's RoPE tables
    Case("mla", {"qk_norm": True}, {"position": "learned"}, name="mla-qk_norm-learned"),
    Case("mla", {"qk_transform": _INVERTIBLE}),
    Case("mla", {"qk_norm": True, "qk_transform": {**_COUPLED, "rope_order": "post"}}),
    Case("mla", {"prefill": "absorbed"}),  # multi-token chunks in the absorbed form too
    Case("mla", {"prefill": "absorbed", "qk_norm": True}, {"bias": True}, name="mla-absorbed-qk_norm-bias"),
    # the deconstructed variants (arXiv 2510.11602) and a hybrid
    Case("mlp", {}),
    Case("approximate", {}),
    Case("approximate", {"normalization": "separate", "chunk_size": 3, "qk_norm": True}),
    Case("approximate", {"impl": "math"}, {"position": "learned"}, name="approximate-math-learned"),
    Case("non_approximate", {}),
    Case("non_approximate", {"chunk_size": 2, "qk_norm": True}),
    Case("static_emb_qk", {}),
    Case("static_emb_qk", {"embedding_norm": False, "qk_norm": True, "impl": "math"}),
    Case("rnd_emb_qk", {}),
    Case("rnd_emb_qk", {"qk_norm": True, "length": 12}, {"position": "learned"}, name="rnd_emb_qk-L12-learned"),
    Case("fixed_seq_qk", {"qk_norm": True, "impl": "math"}),
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


def case_params(cases: list[Case] | None = None) -> list[Any]:
    """`CASES` as pytest params, with the strict xfail of pending backends."""
    params = []
    for case in CASES if cases is None else cases:
        marks = []
        if case.owner is not None:
            reason = f"decode path of {case.backend!r} not implemented yet (owner: {case.owner})"
            marks.append(pytest.mark.xfail(raises=NotImplementedError, strict=True, reason=reason))
        params.append(pytest.param(case, id=case.id, marks=marks))
    return params


def build_model(case: Case, seed: int = 0, dtype: torch.dtype = torch.float64) -> GPT:
    """The tiny GPT of `case` in eval mode and `dtype`, with non-trivial values everywhere (seeded)."""
    torch.manual_seed(seed)
    config = ModelConfig(**{**BASE_CONFIG, **case.config}, attention=case.backend, attention_options=dict(case.options))
    model = GPT(config).to(dtype).eval()
    with torch.no_grad():  # zero-initialised or tiny parameters (gains, last layers) would hide mistakes
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model
