"""Multi-head latent attention (MLA) with decoupled RoPE, as used by the logit-control study.

Architecture: DeepSeek-AI 2024, "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language Model"
(arXiv 2405.04434), §2.1.2-2.1.3, eqs. 9-19. Needed by Anson & Aitchison 2025, "Controlling changes to attention
logits" (arXiv 2511.21377, QuacK; docs/papers.md §3), whose MLA rule (its eq. 22) names the matrices used here::

    c_q  = W_dq x                     (B, T, d_cq)     query latent (RMSNorm'd when latent_norm)
    q_nope^h = W_uq^h c_q             (B, nh, T, d_nope)
    q_rope^h = RoPE(W_qr^h c_q)       (B, nh, T, d_rope)
    c_kv = W_dkv x                    (B, T, d_ckv)    key/value latent: what an inference cache stores
    k_nope^h = W_uk^h c_kv            (B, nh, T, d_nope)
    v^h      = W_uv^h c_kv            (B, nh, T, d_v)
    k_rope   = RoPE(W_kr x)           (B, 1, T, d_rope) ONE decoupled rope key, shared by all heads
    q^h = [q_nope^h; q_rope^h],  k^h = [k_nope^h; k_rope]
    y = concat_h softmax(q^h k^h^T / sqrt(d_nope + d_rope) + causal mask) v^h  W_O       (B, T, C)

Module attributes carry the paper's names so a per-head optimizer (QuacK) can find them: `dq_proj` (W_dq),
`uq_proj` (W_uq), `qr_proj` (W_qr), `dkv_proj` (W_dkv), `uk_proj` (W_uk), `uv_proj` (W_uv), `kr_proj` (W_kr) and
`out_proj` (W_O, C x nh d_v). Head h of a per-head matrix is a contiguous block of output rows: `uq_proj.weight`
rows [h d_nope, (h+1) d_nope), `qr_proj.weight` rows [h d_rope, (h+1) d_rope), `uk_proj.weight` rows
[h d_nope, (h+1) d_nope), `uv_proj.weight` rows [h d_v, (h+1) d_v). `dq_proj`, `dkv_proj` and `kr_proj` are shared
by all heads (hence the max over heads in the QuacK rule).

KV cache and decoding (DeepSeek-V2 §2.1.3, "low-rank key-value joint compression"; `new_cache`, `decode`). The
cache holds per token and layer the latent c_kv and the rotated shared rope key, d_ckv + d_rope values, as ONE
buffer "latent" = [c_kv; RoPE(k_rope)] (B, 1, max_len, d_ckv + d_rope). A single-token decode step never up-projects
a cached token: W_uk^h is absorbed into the query and W_uv^h into the output side::

    q^h . k^h_j = (W_uk^h^T q_nope^h) . c_kv_j + q_rope^h . RoPE(k_rope_j)  (+ q_nope^h . b_uk^h: the same for every
                  key j, so the softmax drops it; only with bias)
    o^h = sum_j p^h_j v^h_j = W_uv^h (sum_j p^h_j c_kv_j) + b_uv^h         (sum_j p^h_j = 1)

so attention is multi-query attention of the nh absorbed queries [W_uk^h^T q_nope^h; q_rope^h] (width d_ckv +
d_rope) over the one cached latent key, whose first d_ckv features are also the value; head h's attention-weighted
latent is then mapped by W_uv^h and W_O. We keep W_uv and W_O as two factors rather than multiplying them out (the
product C x nh d_ckv is the same map, but costs nh d_ckv C multiply-adds per query instead of nh d_ckv d_v + nh d_v C:
nh C^2 / 4 against 1.25 C^2 at the defaults).
Options under which the plain absorption is not exact decode exactly with what they need cached:
    qk_norm: RMSNorm(k^h) = g * k^h / rms(k^h) with one gain g shared by the heads. RoPE and the gain are linear,
        so the cache keeps c_kv, RoPE(g_rope * k_rope) (shared) and each head's scalar 1 / rms(k^h_j) ("k_scale",
        (B, nh, max_len, 1), computed once when token j is appended): d_ckv + d_rope + nh values per token, and
        q^h . k^h_j = (1 / rms(k^h_j)) [(W_uk^h^T (g_nope * q_nope^h)) . c_kv_j + (g_nope * q_nope^h) . b_uk^h
        + q_rope^h . RoPE(g_rope * k_rope_j)] (q^h already normed and rotated; the bias term now depends on j).
        The per-key scale does not fit a fused kernel, so this case scores with explicit math whatever `impl`.
    qk_transform: the transformed key of head h is a nonlinear function of (c_kv_j, k_rope_j, q^h_j), so W_uk
        cannot be absorbed (`absorbed_path_refusal`): the cache keeps the transformed keys of every head ("k",
        (B, nh, max_len, d_nope + d_rope)) and c_kv ("c_kv", (B, 1, max_len, d_ckv)) for the values, whose W_uv^h
        is still absorbed: nh (d_nope + d_rope) + d_ckv values per token.
`kv_cache_values_per_token` gives these counts; the measured bytes equal them (`tests/inference`).
Prefill (a decode-mode chunk of T > 1 new tokens; option `prefill`, default "materialised"): as DeepSeek-V2 (§2.1.3:
the absorption serves inference steps), the chunk's queries attend with the training-time materialised keys and values:
the L = (held + T) cached latents are up-projected, k^h_j = [W_uk^h c_kv_j + b_uk^h; RoPE(k_rope_j)] (times the
cached 1 / rms(k^h_j) and the k gain with qk_norm; the cached transformed keys with a qk_transform) and
v^h_j = W_uv^h c_kv_j + b_uv^h, each head's output is mapped by W_O; the cache still receives only what is listed
above. Both forms are the same function (exact), they differ in cost. Per held token and chunk, materialised spends
nh d_ckv (d_nope + d_v) multiply-adds on the up-projection plus T nh (d_nope + d_rope + d_v) on scores and values
(the fast path pads q/k/v to equal head sizes, as training: `sdpa_equal_head_sizes`); absorbed spends
T nh (2 d_ckv + d_rope) (its queries and values are d_ckv wide). Materialised is therefore cheaper for
T > d_ckv (d_nope + d_v) / (2 d_ckv - d_nope - d_v) (always when 2 d_ckv <= d_nope + d_v): hs nh / (nh - 4) at the
defaults (nh > 4), e.g. T > 21 at C = 256, nh = 16. A whole prompt (L = T) is usually far above that; a short chunk
after a long context is cheaper absorbed ("absorbed" keeps the absorbed form for every chunk). A single token (T = 1)
always decodes absorbed.

Options (`MLAOptions`; defaults: docs/backends.md); every default dimension is a function of the config, chosen when the
option is None:
    impl: `scaled_dot_product_attention` or the explicit "math" path (the test oracle). The q/k head size
        d_nope + d_rope and the value head size d_v may differ; SDPA accepts that, but its flash kernels do not and
        fall back to the unfused math kernel (slower: docs/speed.md), so the fast path zero-pads the
        narrower side to equal sizes (`sdpa_equal_head_sizes`; exact, it changes no score and no output).
    qk_norm: RMSNorm with a learned gain over every head's full q^h and k^h (d_nope + d_rope) before RoPE
        is applied to their rope parts: the QK-norm baseline of arXiv 2511.21377. With qk_norm the shared k_rope is
        normalised per head (jointly with that head's k_nope). The norm needs each head's k^h, but only its scale
        1 / rms(k^h) per token and head, so decoding stays absorbed at the cost of nh more cached values per
        token (see "KV cache" above).
    latent_norm: RMSNorm with a learned gain on c_q and c_kv (DeepSeek-V2 does this; eps = config.norm_eps).
    d_nope (None: hs = n_embd / n_head): per-head no-position q/k width.
    d_rope (None: hs): per-head width of the rotary part (even under RoPE); the shared rope key has this width.
    d_v (None: hs): per-head value width; out_proj maps nh d_v -> C.
    d_cq (None: 3 n_embd // 4): query latent width. 0: no query latent (DeepSeek-V2-Lite, `q_lora_rank` None):
        no W_dq and no query latent norm, the query is a plain projection of x (`uq_proj`, `qr_proj`: C -> nh d),
        i.e. the latent form with W_dq = I (tested). QuacK's MLA rule then takes |W_dq| = 1 (`optim/quack.py`).
    d_ckv (None: n_embd // 4): key/value latent width.
    prefill ("materialised"): how a decode-mode chunk of T > 1 tokens attends ("KV cache" above): "materialised"
        up-projects the held latents to per-head keys and values (DeepSeek-V2 prefill); "absorbed" decodes it like a
        single token. Same outputs, same cache; only the cost differs.

Choice of defaults [NS in arXiv 2511.21377 beyond its one 1B config]. Its §3.4 setting (d_model 2048, 32 heads, MHA
head 64) uses d_nope = d_rope = 64 (= the MHA head size hs, so the q/k head is 2 hs = 128), d_cq = 512 = C/4,
d_ckv = 256 = C/8; d_v is not stated. We keep its head layout (d_nope = d_rope = hs) and take d_v = hs (as
DeepSeek-V2, d_v = d_nope), so out_proj is C x C as in `standard`. Scaling its latents as C/4 and C/8 would give
2.125 C^2 + C hs attention parameters, about 56% of standard's 4 C^2; the lead asked for a count close to standard,
so the latents default to d_cq = 3C/4 and d_ckv = C/4 (the 3:1 query:kv latent ratio of DeepSeek-V2, whose
1536/512 these equal at C = 2048), giving exactly 4 C^2 + C hs (+ d_cq + d_ckv latent-norm gains): +3.2% attention
parameters at the 60m preset, +0.58% for the whole model. The paper's own ratios are one YAML edit away
(d_cq: C/4, d_ckv: C/8). Other [NS] choices: biases follow `config.bias` (DeepSeek has none; our default has none);
all matrices get the generic GPT-2 init (N(0, 0.02), out_proj scaled); rotary frequencies for the d_rope-wide part
are those of a d_rope-wide RoPE (when d_rope divides hs they are every (hs / d_rope)-th column of the model's
tables; otherwise they are built from `config.rope_base` for positions 0..T-1).

FLOPs: 2 x (C d_cq + d_cq nh (d_nope + d_rope) + C d_ckv + d_ckv nh (d_nope + d_v) + C d_rope + nh d_v C) for the
projections, plus 2 T nh (d_nope + d_rope) for scores and 2 T nh d_v for values, per token (training-time form,
keys up-projected; not the absorbed decoding form). The padded fast path executes the value product at
max(d_nope + d_rope, d_v) (2 T nh hs more per token at the defaults), which the count does not credit, as
`differential` does not credit its recomputed scores.

Invariants checked by `tests/unit/attention/backends/test_mla.py`: causality; finite forward/backward; SDPA == math in
fp64
(outputs, input and parameter gradients), with and without qk_norm and latent_norm; the module equals an independent
per-position loop of the equations above; without RoPE and latent norms it equals `StandardAttention` with the
product weights (W_Q^h = [W_uq^h; W_qr^h] W_dq, W_K^h = [W_uk^h W_dkv; W_kr], W_V = W_uv W_dkv); attention computed
from the (c_kv, k_rope) cache with absorbed weights equals the module; one rope key for all heads; the sub-sampled
rotary tables equal d_rope-wide tables; parameter count equals the hand count (and standard's 4 C^2 + C hs at the
defaults); impossible options are refused; both paths compile with fullgraph=True; a tiny GPT learns. Decoding
(`tests/inference`): in fp64 the absorbed decode equals the materialised forward to 1e-10 (token by token, chunked,
after a left-padded prefill; with bias, qk_norm, odd widths, no query latent, learned positions, q/k transforms);
the cache holds only the latent (and the key scales with qk_norm), its bytes equal `kv_cache_values_per_token`; no
cached token is ever up-projected in a single-token step, and a prefill chunk up-projects the held latents once
("materialised"); both `prefill` values give the same outputs to 1e-10.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from lightning_cqk.attention.base import AttentionBackend, AttentionContext, AttentionOptions, QKWeight, QKWeights
from lightning_cqk.attention.cache import LayerCache
from lightning_cqk.attention.kernels.functional import causal_attention, causal_logits, masked_attention
from lightning_cqk.attention.kernels.matched_norm import MatchedRMSNorm
from lightning_cqk.attention.rope import apply_rope, build_rope_cache
from lightning_cqk.attention.transform import build_transform, check_transform, qk_stage, transform_flops

if TYPE_CHECKING:
    from lightning_cqk.model_config import ModelConfig


@dataclass
class MLAOptions(AttentionOptions):
    """Options of `mla`; None dimensions take config-derived defaults (see the module docstring).

    Attributes:
        qk_norm: per-head RMSNorm with a learned gain on q and k (the QK-norm baseline; decoding caches each head's
            key scale 1 / rms(k^h) besides the latent).
        latent_norm: RMSNorm with a learned gain on the latents c_q and c_kv.
        d_cq: query latent width (None: 3 n_embd // 4; 0: no query latent, q = [W_uq; W_qr] x).
        d_ckv: key/value latent width (None: n_embd // 4).
        d_rope: per-head rotary q/k width and width of the shared rope key (None: head size).
        d_nope: per-head non-rotary q/k width (None: head size).
        d_v: per-head value width (None: head size).
        qk_transform: learned q/k transform on each head's materialised (q^h, k^h), `transform.py`; None. It makes
            k^h a nonlinear function of (c_kv, k_rope, the token's q^h), so W_uk cannot be absorbed
            (`absorbed_path_refusal`): decoding caches the transformed per-head keys (and c_kv for the values).
        prefill: "materialised" (default): a decode-mode chunk of T > 1 tokens attends with per-head keys and values
            up-projected from the held latents, as DeepSeek-V2 prefills (cheaper for long chunks); "absorbed": with
            the absorbed queries like a single token (cheaper for a short chunk after a long context). Exact either
            way; single tokens always decode absorbed; the cache is the same.
    """

    qk_norm: bool = False
    latent_norm: bool = True
    d_cq: int | None = None
    d_ckv: int | None = None
    d_rope: int | None = None
    d_nope: int | None = None
    d_v: int | None = None
    qk_transform: dict | None = None
    prefill: str = "materialised"


class MLADims(NamedTuple):
    """Resolved MLA widths (d_cq 0: no query latent)."""

    d_cq: int
    d_ckv: int
    d_rope: int
    d_nope: int
    d_v: int


def mla_dims(config: ModelConfig, options: MLAOptions) -> MLADims:
    """The widths `options` asks for, with None replaced by the config-derived defaults."""
    C, hs = config.n_embd, config.head_size
    defaults = {"d_cq": max(1, 3 * C // 4), "d_ckv": max(1, C // 4), "d_rope": hs, "d_nope": hs, "d_v": hs}
    return MLADims(**{k: defaults[k] if getattr(options, k) is None else getattr(options, k) for k in MLADims._fields})


def sdpa_equal_head_sizes(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, dropout_p: float = 0.0
) -> torch.Tensor:
    """Causal SDPA for q, k (B, nh, T, E) and v (B, nh, T, Ev), zero-padding the narrower side to max(E, Ev).

    Fused kernels that need equal head sizes (PyTorch's CPU and CUDA flash kernels) otherwise fall back to the
    unfused math kernel, which is slower (measured: docs/speed.md, "Kernel choices measured"). Zero features change
    no score (the scale is passed explicitly) and padded value columns are dropped.
    Returns (B, nh, T, Ev).
    """
    e, ev = q.size(-1), v.size(-1)
    if ev < e:
        v = F.pad(v, (0, e - ev))  # (B, nh, T, E)
    elif e < ev:
        q, k = F.pad(q, (0, ev - e)), F.pad(k, (0, ev - e))  # (B, nh, T, Ev) each
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, dropout_p=dropout_p)
    return y[..., :ev]  # (B, nh, T, Ev)


class MultiHeadLatentAttention(AttentionBackend):
    """Low-rank (latent) queries and keys/values with a decoupled, head-shared rotary key (DeepSeek-V2 MLA).

    Attributes:
        dq_proj: W_dq, C -> d_cq (None when d_cq = 0: no query latent).
        uq_proj: W_uq, d_cq -> nh d_nope (head h: rows [h d_nope, (h+1) d_nope)); C -> nh d_nope without latent.
        qr_proj: W_qr, d_cq -> nh d_rope (C -> nh d_rope without latent).
        dkv_proj: W_dkv, C -> d_ckv.
        uk_proj: W_uk, d_ckv -> nh d_nope.
        uv_proj: W_uv, d_ckv -> nh d_v.
        kr_proj: W_kr, C -> d_rope (one rope key for all heads).
        out_proj: W_O, nh d_v -> C.
        q_latent_norm, kv_latent_norm: RMSNorms on c_q and c_kv (None without latent_norm).
        q_norm, k_norm: per-head RMSNorms over d_nope + d_rope (None without qk_norm).
    """

    name = "mla"
    Options = MLAOptions

    def __init__(self, config: ModelConfig, layer_idx: int, options: MLAOptions) -> None:
        super().__init__(config, layer_idx, options)
        C, nh, bias = config.n_embd, config.n_head, config.bias
        self.n_head = nh
        self.dims = dims = mla_dims(config, options)
        self.scale = 1.0 / math.sqrt(dims.d_nope + dims.d_rope)
        q_in = dims.d_cq or C  # no query latent: the query projections read x
        self.dq_proj = nn.Linear(C, dims.d_cq, bias=bias) if dims.d_cq else None
        self.uq_proj = nn.Linear(q_in, nh * dims.d_nope, bias=bias)
        self.qr_proj = nn.Linear(q_in, nh * dims.d_rope, bias=bias)
        self.dkv_proj = nn.Linear(C, dims.d_ckv, bias=bias)
        self.uk_proj = nn.Linear(dims.d_ckv, nh * dims.d_nope, bias=bias)
        self.uv_proj = nn.Linear(dims.d_ckv, nh * dims.d_v, bias=bias)
        self.kr_proj = nn.Linear(C, dims.d_rope, bias=bias)
        self.out_proj = nn.Linear(nh * dims.d_v, C, bias=bias)
        if options.latent_norm:
            self.q_latent_norm = MatchedRMSNorm(dims.d_cq, eps=config.norm_eps) if dims.d_cq else None
            self.kv_latent_norm = MatchedRMSNorm(dims.d_ckv, eps=config.norm_eps)
        else:
            self.q_latent_norm = self.kv_latent_norm = None
        if options.qk_norm:
            self.q_norm = MatchedRMSNorm(dims.d_nope + dims.d_rope, eps=config.norm_eps)
            self.k_norm = MatchedRMSNorm(dims.d_nope + dims.d_rope, eps=config.norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.qk_transform = build_transform(options.qk_transform, config, layer_idx, nh, dims.d_nope + dims.d_rope)
        self.attn_dropout = config.attn_dropout_p
        self.resid_dropout = nn.Dropout(config.resid_dropout_p)

    def latents(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """c_q (B, T, d_cq) and c_kv (B, T, d_ckv), normalised when latent_norm; c_q is x itself without a query
        latent (d_cq 0)."""
        c_q = x if self.dq_proj is None else self.dq_proj(x)  # (B, T, d_cq or C)
        c_kv = self.dkv_proj(x)  # (B, T, d_ckv)
        if self.q_latent_norm is not None:
            c_q = self.q_latent_norm(c_q)  # (B, T, d_cq)
        if self.kv_latent_norm is not None:
            c_kv = self.kv_latent_norm(c_kv)  # (B, T, d_ckv)
        return c_q, c_kv

    def rope_tables(self, ctx: AttentionContext) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """cos/sin tables for the rotary part, or (None, None) without RoPE: (T, d_rope / 2) in training, and in
        decode mode (B, 1, T, d_rope / 2) at each token's position (`ctx.positions`)."""
        if ctx.cos is None or ctx.sin is None:
            return None, None
        hs, d_rope = self.config.head_size, self.dims.d_rope
        if hs % d_rope == 0:
            # The model's tables hold angles t * base^(-2j / hs); j = i * hs / d_rope gives base^(-2i / d_rope).
            stride = hs // d_rope
            return ctx.cos[..., ::stride], ctx.sin[..., ::stride]  # (T or B, 1, T, d_rope/2) each
        if ctx.positions is not None:
            # Decode mode: the angles of `build_rope_cache` (t * inv_freq in fp32), at each row's positions.
            device = ctx.positions.device
            inv_freq = self.config.rope_base ** (
                -torch.arange(0, d_rope, 2, device=device, dtype=torch.float32) / d_rope
            )  # (d_rope/2,)
            angles = (ctx.positions.to(torch.float32).unsqueeze(-1) * inv_freq).unsqueeze(1)  # (B, 1, T, d_rope/2)
            return angles.cos().to(ctx.cos.dtype), angles.sin().to(ctx.sin.dtype)
        cos, sin = build_rope_cache(ctx.cos.size(0), d_rope, self.config.rope_base, device=ctx.cos.device)
        return cos.to(ctx.cos.dtype), sin.to(ctx.sin.dtype)  # (T, d_rope/2) each

    def project(self, x: torch.Tensor, ctx: AttentionContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (B, nh, T, d_nope + d_rope) and v (B, nh, T, d_v) from x (B, T, C), RoPE applied."""
        B, T, _ = x.shape
        c_q, c_kv = self.latents(x)  # (B, T, d_cq), (B, T, d_ckv)
        q, k = self.query_key(x, c_q, c_kv, ctx)  # (B, nh, T, d_nope + d_rope) each
        v = self.uv_proj(c_kv).view(B, T, self.n_head, self.dims.d_v).transpose(1, 2)  # (B, nh, T, d_v)
        return q, k, v

    def query_key(
        self, x: torch.Tensor, c_q: torch.Tensor, c_kv: torch.Tensor, ctx: AttentionContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The materialised q, k (B, nh, T, d_nope + d_rope) of x (B, T, C) and its latents, RoPE applied."""
        B, T, _ = x.shape
        nh, d = self.n_head, self.dims
        q_nope = self.uq_proj(c_q).view(B, T, nh, d.d_nope).transpose(1, 2)  # (B, nh, T, d_nope)
        q_rope = self.qr_proj(c_q).view(B, T, nh, d.d_rope).transpose(1, 2)  # (B, nh, T, d_rope)
        k_nope = self.uk_proj(c_kv).view(B, T, nh, d.d_nope).transpose(1, 2)  # (B, nh, T, d_nope)
        k_rope = self.kr_proj(x).unsqueeze(1)  # (B, 1, T, d_rope): one rope key shared by all heads
        cos, sin = self.rope_tables(ctx)
        if self.qk_transform is not None:
            # The q/k stage on the materialised heads: norm, transform and a rotation of the trailing d_rope features.
            def rope(t: torch.Tensor) -> torch.Tensor:
                nope, rot = t.split((d.d_nope, d.d_rope), dim=-1)
                return torch.cat((nope, apply_rope(rot, cos, sin)), dim=-1)  # (B, nh, T, d_nope + d_rope)

            # Concatenated token-major, (B, T, nh, d) in memory: the transform reads that layout without a copy.
            q = torch.cat((q_nope.transpose(1, 2), q_rope.transpose(1, 2)), dim=-1).transpose(1, 2)  # (B, nh, T, d_qk)
            k_rope = k_rope.expand(B, nh, T, d.d_rope)  # (B, nh, T, d_rope)
            k = torch.cat((k_nope.transpose(1, 2), k_rope.transpose(1, 2)), dim=-1).transpose(1, 2)  # (B, nh, T, d_qk)
            return qk_stage(q, k, ctx, q_norm=self.q_norm, k_norm=self.k_norm, transform=self.qk_transform, rope=rope)
        if self.q_norm is None:
            q_rope = apply_rope(q_rope, cos, sin)  # (B, nh, T, d_rope)
            # Rotate the shared key once, then broadcast it to the heads.
            k_rope = apply_rope(k_rope, cos, sin).expand(B, nh, T, d.d_rope)  # (B, nh, T, d_rope)
        else:
            # QK-norm over each head's whole q / k (Qwen3 placement: before RoPE), then rotate the rope parts.
            q = self.q_norm(torch.cat((q_nope, q_rope), dim=-1))  # (B, nh, T, d_nope + d_rope)
            k = self.k_norm(torch.cat((k_nope, k_rope.expand(B, nh, T, d.d_rope)), dim=-1))  # (B, nh, T, d_qk)
            q_nope, q_rope = q.split((d.d_nope, d.d_rope), dim=-1)
            k_nope, k_rope = k.split((d.d_nope, d.d_rope), dim=-1)
            q_rope, k_rope = apply_rope(q_rope, cos, sin), apply_rope(k_rope, cos, sin)
        q = torch.cat((q_nope, q_rope), dim=-1)  # (B, nh, T, d_nope + d_rope)
        k = torch.cat((k_nope, k_rope), dim=-1)  # (B, nh, T, d_nope + d_rope)
        return q, k

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        if ctx.decoding:
            return self.decode(x, ctx)
        B, T, _ = x.shape
        q, k, v = self.project(x, ctx)  # q, k (B, nh, T, d_nope + d_rope); v (B, nh, T, d_v)
        dropout_p = self.attn_dropout if self.training else 0.0
        if self.options.impl == "sdpa":
            y = sdpa_equal_head_sizes(q, k, v, scale=self.scale, dropout_p=dropout_p)  # (B, nh, T, d_v)
        else:
            y = causal_attention(q, k, v, impl=self.options.impl, scale=self.scale, dropout_p=dropout_p)  # (B,nh,T,d_v)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.dims.d_v)  # (B, T, nh d_v)
        return self.resid_dropout(self.out_proj(y))  # (B, T, C)

    def new_cache(
        self, batch_size: int, max_len: int, device: torch.device | str | None, dtype: torch.dtype | None
    ) -> LayerCache:
        """The latent cache of the module docstring: "latent" [c_kv; RoPE(k_rope)] (B, 1, max_len, d_ckv + d_rope),
        plus "k_scale" 1 / rms(k^h) (B, nh, max_len, 1) with qk_norm; with a qk_transform the transformed keys "k"
        (B, nh, max_len, d_nope + d_rope) and "c_kv" (B, 1, max_len, d_ckv) instead."""
        d = self.dims
        if self.qk_transform is not None:
            buffers = {"k": (self.n_head, d.d_nope + d.d_rope), "c_kv": (1, d.d_ckv)}
        else:
            buffers = {"latent": (1, d.d_ckv + d.d_rope)}
            if self.k_norm is not None:
                buffers["k_scale"] = (self.n_head, 1)
        return LayerCache(batch_size, max_len, device, dtype, buffers=buffers)

    def decode(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """Decode mode: the next T tokens x (B, T, C) against the latent cache `ctx.cache` -> (B, T, C).

        Absorbed form (module docstring): attention of the absorbed queries over the cached latents, giving each
        head's attention-weighted latent (B, nh, T, d_ckv), then W_uv^h and W_O. A chunk of T > 1 tokens with
        prefill "materialised" attends with the up-projected keys and values of the L held tokens instead (module
        docstring, "Prefill"); the cache receives the same entries either way.
        """
        B, T, _ = x.shape
        nh, d = self.n_head, self.dims
        materialise = T > 1 and self.options.prefill == "materialised"
        c_q, c_kv = self.latents(x)  # (B, T, d_cq), (B, T, d_ckv)
        if self.qk_transform is not None:
            q, k = self.query_key(x, c_q, c_kv, ctx)  # (B, nh, T, d_nope + d_rope) each, transformed and rotated
            held = ctx.cache.append(k=k, c_kv=c_kv.unsqueeze(1))  # k (B, nh, L, d_qk); c_kv (B, 1, L, d_ckv)
            if materialise:
                return self.materialised_attention(q, held["k"], held["c_kv"], ctx)  # (B, T, C)
            y = masked_attention(q, held["k"], held["c_kv"], ctx.attn_mask, self.options.impl, self.scale)
            return self.absorbed_output(y)  # (B, T, C); y (B, nh, T, d_ckv)
        cos, sin = self.rope_tables(ctx)  # (B, 1, T, d_rope/2) each, or None
        q_nope = self.uq_proj(c_q).view(B, T, nh, d.d_nope).transpose(1, 2)  # (B, nh, T, d_nope)
        q_rope = self.qr_proj(c_q).view(B, T, nh, d.d_rope).transpose(1, 2)  # (B, nh, T, d_rope)
        k_rope = self.kr_proj(x).unsqueeze(1)  # (B, 1, T, d_rope)
        w_uk = self.uk_proj.weight.view(nh, d.d_nope, d.d_ckv)  # (nh, d_nope, d_ckv)
        if self.k_norm is None and materialise:
            new = torch.cat((c_kv.unsqueeze(1), apply_rope(k_rope, cos, sin)), dim=-1)  # (B, 1, T, d_ckv + d_rope)
            latent = ctx.cache.append(latent=new)["latent"]  # (B, 1, L, d_ckv + d_rope)
            q = torch.cat((q_nope, apply_rope(q_rope, cos, sin)), dim=-1)  # (B, nh, T, d_nope + d_rope)
            c_held, rope_held = latent.to(q.dtype).split((d.d_ckv, d.d_rope), dim=-1)  # (B,1,L,d_ckv), (B,1,L,d_r)
            k = self.materialised_keys(c_held, rope_held)  # (B, nh, L, d_nope + d_rope)
            return self.materialised_attention(q, k, c_held, ctx)  # (B, T, C)
        if self.k_norm is None:
            q_latent = torch.einsum("bhtn,hnc->bhtc", q_nope, w_uk)  # (B, nh, T, d_ckv): W_uk^h absorbed
            q = torch.cat((q_latent, apply_rope(q_rope, cos, sin)), dim=-1)  # (B, nh, T, d_ckv + d_rope)
            new = torch.cat((c_kv.unsqueeze(1), apply_rope(k_rope, cos, sin)), dim=-1)  # (B, 1, T, d_ckv + d_rope)
            latent = ctx.cache.append(latent=new)["latent"]  # (B, 1, L, d_ckv + d_rope)
            values = latent[..., : d.d_ckv]  # (B, 1, L, d_ckv)
            y = masked_attention(q, latent, values, ctx.attn_mask, self.options.impl, self.scale)  # (B,nh,T,d_ckv)
            return self.absorbed_output(y)  # (B, T, C)
        # qk_norm: the new keys' per-head scales from their materialised k^h (once per token), gains into q and k_rope.
        k_nope = self.uk_proj(c_kv).view(B, T, nh, d.d_nope).transpose(1, 2)  # (B, nh, T, d_nope)
        k_full = torch.cat((k_nope, k_rope.expand(B, nh, T, d.d_rope)), dim=-1)  # (B, nh, T, d_nope + d_rope)
        eps = self.k_norm.eps if self.k_norm.eps is not None else torch.finfo(k_full.dtype).eps
        k_scale = torch.rsqrt(k_full.pow(2).mean(-1, keepdim=True) + eps)  # (B, nh, T, 1)
        g_nope, g_rope = self.k_norm.weight.split((d.d_nope, d.d_rope))  # (d_nope,), (d_rope,)
        q = self.q_norm(torch.cat((q_nope, q_rope), dim=-1))  # (B, nh, T, d_nope + d_rope)
        q_nope, q_rope = q.split((d.d_nope, d.d_rope), dim=-1)
        new = torch.cat((c_kv.unsqueeze(1), apply_rope(k_rope * g_rope, cos, sin)), dim=-1)  # (B, 1, T, d_ckv + d_r)
        held = ctx.cache.append(latent=new, k_scale=k_scale)  # (B, 1, L, d_ckv + d_rope), (B, nh, L, 1)
        latent, scales = held["latent"], held["k_scale"]
        if materialise:
            # RMSNorm(k^h_j) = (1 / rms(k^h_j)) [g_nope * (W_uk^h c_kv_j + b_uk^h); RoPE(g_rope * k_rope_j)].
            q = torch.cat((q_nope, apply_rope(q_rope, cos, sin)), dim=-1)  # (B, nh, T, d_nope + d_rope)
            c_held, rope_held = latent.to(q.dtype).split((d.d_ckv, d.d_rope), dim=-1)  # (B,1,L,d_ckv), (B,1,L,d_r)
            k = self.materialised_keys(c_held, rope_held, g_nope) * scales.to(q.dtype)  # (B, nh, L, d_nope + d_rope)
            return self.materialised_attention(q, k, c_held, ctx)  # (B, T, C)
        q_nope = q_nope * g_nope  # (B, nh, T, d_nope): k's no-position gain, moved to the query
        q_latent = torch.einsum("bhtn,hnc->bhtc", q_nope, w_uk)  # (B, nh, T, d_ckv)
        q = torch.cat((q_latent, apply_rope(q_rope, cos, sin)), dim=-1)  # (B, nh, T, d_ckv + d_rope)
        compute = torch.promote_types(q.dtype, torch.float32)
        scores = q.to(compute) @ latent.to(compute).transpose(-1, -2)  # (B, nh, T, L)
        if self.uk_proj.bias is not None:
            bias = (q_nope * self.uk_proj.bias.view(nh, 1, d.d_nope)).sum(-1, keepdim=True)  # (B, nh, T, 1)
            scores = scores + bias.to(compute)  # it varies with the key through the key's scale
        scores = scores * scales.to(compute).transpose(-1, -2) * self.scale  # (B, nh, T, L)
        if ctx.attn_mask is not None:
            scores = scores.masked_fill(~ctx.attn_mask, float("-inf"))
        y = (scores.softmax(-1) @ latent[..., : d.d_ckv].to(compute)).to(q.dtype)  # (B, nh, T, d_ckv)
        return self.absorbed_output(y)  # (B, T, C)

    def materialised_keys(
        self, c_kv: torch.Tensor, k_rope: torch.Tensor, g_nope: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Per-head keys [g_nope * (W_uk^h c_kv_j + b_uk^h); k_rope_j] (B, nh, L, d_nope + d_rope) of the held latents
        c_kv (B, 1, L, d_ckv) and their (rotated) shared rope keys k_rope (B, 1, L, d_rope); g_nope: qk_norm's gain."""
        B, _, L, _ = c_kv.shape
        nh, d = self.n_head, self.dims
        k_nope = self.uk_proj(c_kv.squeeze(1)).view(B, L, nh, d.d_nope).transpose(1, 2)  # (B, nh, L, d_nope)
        if g_nope is not None:
            k_nope = k_nope * g_nope
        return torch.cat((k_nope, k_rope.to(k_nope.dtype).expand(B, nh, L, d.d_rope)), dim=-1)  # (B, nh, L, d_qk)

    def materialised_attention(
        self, q: torch.Tensor, k: torch.Tensor, c_kv: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        """Prefill: queries q (B, nh, T, d_qk) over per-head keys k (B, nh, L, d_qk) and the values W_uv^h c_kv_j +
        b_uv^h up-projected from the held latents c_kv (B, 1, L, d_ckv), masked by `ctx.attn_mask`, then W_O ->
        (B, T, C)."""
        B, nh, T, _ = q.shape
        L, d = c_kv.size(2), self.dims
        v = self.uv_proj(c_kv.squeeze(1).to(q.dtype)).view(B, L, nh, d.d_v).transpose(1, 2)  # (B, nh, L, d_v)
        k, e = k.to(q.dtype), max(q.size(-1), d.d_v)
        if self.options.impl == "sdpa":
            # Equal head sizes, as `sdpa_equal_head_sizes`: else SDPA's masked CPU flash kernel falls back to math.
            q, k, v = (F.pad(t, (0, e - t.size(-1))) for t in (q, k, v))  # (B, nh, T or L, e) each
        y = masked_attention(q, k, v, ctx.attn_mask, self.options.impl, self.scale)[..., : d.d_v]  # (B, nh, T, d_v)
        y = y.transpose(1, 2).reshape(B, T, nh * d.d_v)  # (B, T, nh d_v)
        return self.resid_dropout(self.out_proj(y))  # (B, T, C)

    def absorbed_output(self, y: torch.Tensor) -> torch.Tensor:
        """Each head's attention-weighted latent (B, nh, T, d_ckv) -> W_uv^h (and b_uv^h: the weights sum to 1), then
        W_O -> (B, T, C)."""
        B, nh, T, _ = y.shape
        d = self.dims
        w_uv = self.uv_proj.weight.view(nh, d.d_v, d.d_ckv)  # (nh, d_v, d_ckv)
        v = torch.einsum("bhtc,hvc->bhtv", y, w_uv)  # (B, nh, T, d_v)
        if self.uv_proj.bias is not None:
            v = v + self.uv_proj.bias.view(nh, 1, d.d_v)
        v = v.transpose(1, 2).reshape(B, T, nh * d.d_v)  # (B, T, nh d_v)
        return self.resid_dropout(self.out_proj(v))  # (B, T, C)

    def qk_weights(self) -> QKWeights:
        """The six latent Q/K matrices (arXiv 2511.21377 eq. 22): W_dq, W_uq (per head), W_qr (per head), W_dkv,
        W_uk (per head), W_kr (one rope key for all heads); five without a query latent (no W_dq)."""
        nh = self.n_head
        names = (("dq_proj", 1), ("uq_proj", nh), ("qr_proj", nh), ("dkv_proj", 1), ("uk_proj", nh), ("kr_proj", 1))
        roles = ("dq", "uq", "qr", "dkv", "uk", "kr")
        return QKWeights(
            "mla",
            tuple(
                QKWeight(n, r, b)
                for (n, b), r in zip(names, roles, strict=True)
                if getattr(self, n) is not None  # no dq_proj without a query latent (d_cq 0)
            ),
        )

    PARAMETER_GROUPS = {"out_proj": "out", "uv_proj": "v"}

    def reset_backend_parameters(self) -> None:
        if self.qk_transform is not None:
            self.qk_transform.reset_parameters()

    def dynamics_stats(self) -> dict[str, torch.Tensor]:
        """The learned transform's per-layer quantities; {} without one."""
        return {} if self.qk_transform is None else self.qk_transform.stats()

    @classmethod
    def absorbed_path_refusal(cls, options: MLAOptions) -> str | None:
        """Why W_uk cannot be absorbed into the query for `options` (decoding then caches the transformed per-head
        keys instead, `new_cache`), or None when attention runs on the cached latent (with qk_norm too: the cache then
        also keeps each head's key scale). Tested in `tests/unit/attention/backends/test_mla.py` and
        `tests/inference`."""
        if options.qk_transform is not None:
            return (
                "qk_transform makes each head's key a nonlinear function of (c_kv, k_rope) and of its own token's "
                "query, so q^h . k^h cannot be rewritten as (q^h W_uk^h) . c_kv: decoding caches the transformed "
                "per-head keys (kv_cache_values_per_token counts them)."
            )
        return None

    def attention_logits(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """q^h k^h^T / sqrt(d_nope + d_rope) for every head, (B, nh, T, T) fp32."""
        q, k, _ = self.project(x, ctx)  # (B, nh, T, d_nope + d_rope) each
        return causal_logits(q, k, self.scale)  # (B, nh, T, T)

    @classmethod
    def check_config(cls, config: ModelConfig, layer_idx: int, options: MLAOptions) -> None:
        if options.impl not in ("sdpa", "math"):
            raise ValueError(f"impl={options.impl!r} is not available for mla; choose 'sdpa' or 'math'.")
        if options.prefill not in ("materialised", "absorbed"):
            raise ValueError(
                f"mla option prefill={options.prefill!r} is not known; choose 'materialised' (a multi-token chunk "
                "attends with up-projected keys and values, the default) or 'absorbed' (every chunk decodes absorbed)."
            )
        for key in MLADims._fields:
            value = getattr(options, key)
            low = 0 if key == "d_cq" else 1  # d_cq 0: no query latent
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                zero = " (d_cq 0: no query latent)" if key == "d_cq" else ""
                raise ValueError(
                    f"mla option {key}={value!r} must be a {'non-negative' if low == 0 else 'positive'} integer{zero}, "
                    f"or null for the default ({getattr(mla_dims(config, MLAOptions()), key)} for this config)."
                )
        dims = mla_dims(config, options)
        where = f"attention {cls.name!r} (layer {layer_idx})"
        check_transform(options.qk_transform, config, layer_idx, config.n_head, dims.d_nope + dims.d_rope, where, False)
        d_rope = dims.d_rope
        if config.position == "rope" and d_rope % 2:
            raise ValueError(
                f"mla option d_rope={d_rope} must be even: RoPE rotates pairs of features. Use d_rope={d_rope + 1} "
                f"or {max(2, d_rope - 1)} (null gives the head size, {config.head_size})."
            )

    @classmethod
    def forward_flops_per_token(cls, config: ModelConfig, options: MLAOptions, seq_len: int) -> int:
        C, nh = config.n_embd, config.n_head
        d = mla_dims(config, options)
        projections = (
            C * d.d_cq  # W_dq (0 without a query latent)
            + (d.d_cq or C) * nh * (d.d_nope + d.d_rope)  # W_uq, W_qr
            + C * d.d_ckv  # W_dkv
            + d.d_ckv * nh * (d.d_nope + d.d_v)  # W_uk, W_uv
            + C * d.d_rope  # W_kr
            + nh * d.d_v * C  # W_O
        )
        scores_and_values = seq_len * nh * (d.d_nope + d.d_rope) + seq_len * nh * d.d_v
        return 2 * (projections + scores_and_values) + transform_flops(options.qk_transform, nh, d.d_nope + d.d_rope)

    @classmethod
    def kv_cache_values_per_token(cls, config: ModelConfig, options: MLAOptions) -> int:
        """What `new_cache` keeps per token (module docstring): c_kv and the shared rotated rope key, plus one key
        scale per head with qk_norm; with a qk_transform the transformed per-head keys and c_kv."""
        d = mla_dims(config, options)
        if options.qk_transform is not None:  # transformed per-head keys, and c_kv for the (absorbable) values
            return config.n_head * (d.d_nope + d.d_rope) + d.d_ckv
        return d.d_ckv + d.d_rope + (config.n_head if options.qk_norm else 0)
