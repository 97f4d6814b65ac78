"""The contract checks, one function each (see `lightning_cqk.contract`; docs/your-attention.md lists them).

Each check takes a `Case` and returns a short string of what it measured; it raises `AssertionError` naming what broke
(a leaky backend fails naming causality), or `NotApplicable` when the check cannot apply to this backend (one path
only, no softmax maps, no cache), saying so. All checks run on the tiny model of `cases.BASE_CONFIG`, fp64 unless
the check is about another precision.

- causality of the layer and of the model: changing future inputs (tokens, embeddings) never changes past outputs,
  and later outputs do change;
- batch rows independent: a row's logits do not depend on the other rows (changed, or absent);
- deterministic: the same seed twice gives bit-identical outputs and gradients;
- fast path == math path (`impl="sdpa"` vs `impl="math"`): forward and every gradient to TOL relative;
- fp32 forward and backward finite, every parameter gets a gradient; bf16 autocast finite;
- the Q/K seam (`AttentionBackend.qk_weights`): the stated matrices' row blocks feed exactly their heads' logit maps;
- decode parity: decoding with the cache (token by token, after prefills, in chunks, in one shot) equals the full
  forward to TOL;
- compiled graphs: the blocks share their graphs whatever the depth (dynamo's eager backend);
- FLOPs: the declared `forward_flops_per_token` within 5% of what `torch.utils.flop_counter` counts on the math path;
- parameters counted; the state dict round-trips (saved, loaded weights_only into another init: same outputs);
- learning: the tiny GPT over bytes (fp32) learns real text: LEARN_STEPS AdamW steps take the loss below 0.8 x its
  start.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import itertools
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from lightning_cqk import attention
from lightning_cqk.attention import AttentionBackend
from lightning_cqk.contract.cases import (
    CUT,
    TOL,
    B,
    Case,
    T,
    build_model,
    layer_inputs,
    layer_under_test,
    layers_of,
    model_config,
)
from lightning_cqk.model.gpt import GPT

LEARN_STEPS = 40  # optimizer steps of the learning check
FLOPS_TOLERANCE = 0.05  # relative, declared vs counted forward FLOPs
GROUPS = {"q", "k", "v", "out", "norms", "backend"}


class NotApplicable(Exception):
    """The check cannot apply to this backend; the message says why (a note in the table, not a pass)."""


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def with_impl(case: Case, impl: str) -> Case:
    return dataclasses.replace(case, options={**case.options, "impl": impl})


def check_builds(case: Case) -> str:
    """The tiny model builds (config validated, every layer constructed)."""
    model = build_model(case)
    layers = layers_of(model, case)
    assert layers, f"{case.id}: no layer runs {case.backend!r}"
    return f"{len(layers)} of {len(model.blocks)} layers run it"


def check_layer_causality(case: Case) -> str:
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
    return f"max change before t={CUT}: {leak:.1e}"


def check_model_causality(case: Case) -> str:
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
    return f"max change before t={CUT}: {leak:.1e}"


def check_batch_rows(case: Case) -> str:
    """Row 0's logits are the same whatever row 1 holds, and the same when row 0 runs alone."""
    model = build_model(case)
    g = torch.Generator().manual_seed(6)
    V = model.config.vocab_size
    idx = torch.randint(0, V, (B, T), generator=g)
    other = idx.clone()
    other[1:] = (other[1:] + torch.randint(1, V, (B - 1, T), generator=g)) % V
    with torch.no_grad():
        logits, changed, alone = model(idx), model(other), model(idx[:1])  # (B, T, V), (B, T, V), (1, T, V)
    cross = (changed[0] - logits[0]).abs().max().item()
    solo = (alone[0] - logits[0]).abs().max().item()
    assert cross <= 1e-12, f"{case.id}: changing row 1 changed row 0's logits by {cross:.3e} (rows not independent)"
    assert solo <= TOL, f"{case.id}: row 0 alone differs from row 0 in a batch by {solo:.3e} (rows not independent)"
    return f"other row changed: {cross:.1e}; row alone: {solo:.1e}"


def check_deterministic(case: Case) -> str:
    """The same seed twice (a fresh fp32 model each time, the same batch): bit-identical outputs and gradients."""
    runs = []
    for _ in range(2):
        model = build_model(case, dtype=torch.float32).train()
        idx = torch.randint(0, model.config.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(3))
        logits = model(idx[:, :-1])  # (B, T, V)
        F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten()).backward()
        runs.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (y0, g0), (y1, g1) = runs
    assert torch.equal(y0, y1), f"{case.id}: the same seed gave other outputs (max diff {(y0 - y1).abs().max():.3e})"
    for name, grad in g0.items():
        other = g1[name]
        same = (grad is None and other is None) or (grad is not None and other is not None and torch.equal(grad, other))
        assert same, f"{case.id}: the same seed gave another gradient of {name} (not deterministic)"
    return f"outputs and {len(g0)} gradients bit-identical"


def check_fast_equals_math(case: Case) -> str:
    """impl="sdpa" and impl="math" with the same weights: outputs and every gradient agree to TOL (relative).

    NotApplicable when the backend has one path only (no `impl` option, or bit-identical outputs on both)."""
    cls = attention.get_attention(case.backend)
    if "impl" not in {f.name for f in dataclasses.fields(cls.Options)}:
        raise NotApplicable("one path only: the options have no impl (no fast path to check against a reference)")
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
    worst = 0.0
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
            worst = max(worst, rel(ga, gb))
    if torch.equal(outputs[0], outputs[1]) and all(
        ga is None or torch.equal(ga, grads[1][k]) for k, ga in grads[0].items()
    ):
        raise NotApplicable(
            "one path only: impl='sdpa' and impl='math' give bit-identical outputs and gradients, so no fast path is "
            "checked against a reference"
        )
    return f"forward rel {rel(outputs[0], outputs[1]):.1e}; gradients rel <= {worst:.1e}"


def check_fp32_finite(case: Case) -> str:
    """An fp32 model's loss and every parameter's gradient are finite; every parameter gets a gradient."""
    model = build_model(case, dtype=torch.float32).train()
    idx = torch.randint(0, model.config.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(3))
    loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    assert torch.isfinite(loss), f"{case.id}: fp32 loss {loss.item()}"
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), f"{case.id}: {name} gradient missing or not finite"
    return f"loss {loss.item():.3f}; {sum(1 for _ in model.parameters())} parameters get finite gradients"


def check_bf16_autocast(case: Case) -> str:
    """Under bf16 autocast (the device's: CPU here) the loss and every gradient are finite."""
    model = build_model(case, dtype=torch.float32).train()
    idx = torch.randint(0, model.config.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1).float(), idx[:, 1:].flatten())
    loss.backward()
    assert torch.isfinite(loss), f"{case.id}: bf16 autocast loss {loss.item()}"
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), f"{case.id}: {name} gradient not finite under bf16"
    return f"loss {loss.item():.3f}, gradients finite"


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


def check_qk_seam(case: Case) -> str:
    """`qk_weights()` states the matrices whose row blocks make each head's logits; the groups agree with the logits.
    NotApplicable without softmax maps (`attention_logits` None: attention stats, QK-clip and QuacK leave it alone)."""
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
        raise NotApplicable("no softmax maps (attention_logits is None): attention stats, QK-clip, QuacK skip it")
    n_maps = logits.size(1)
    assert logits.dtype == torch.float64 and logits.shape[0] in (1, B) and logits.shape[2:] == (T, T)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    assert torch.isneginf(logits[..., future]).all(), f"{case.id}: future logits are not -inf"
    assert torch.isfinite(logits[..., ~future]).all(), f"{case.id}: past logits are not finite"
    for name, p in attn.named_parameters():  # value and output weights never move a logit
        if attn.parameter_group(name) in ("v", "out"):
            assert not changed_maps(attn, x, ctx, logits, [p]), f"{case.id}: {name} (not Q/K) changes the logits"
    if spec is None:
        return f"{n_maps} logit maps; no Q/K weights stated (QuacK and QK-clip leave the layer alone)"
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
    return f"{n_maps} logit maps; {spec.rule} rule, {len(spec.weights)} Q/K matrices feed their own heads"


def _decodes(cls: type[AttentionBackend]) -> bool:
    return cls.new_cache is not AttentionBackend.new_cache


def check_decode_parity(case: Case) -> str:
    """Token by token from an empty cache, prefills of 1 and 6 tokens then one token at a time, in chunks and in one
    shot: the logits equal the full forward's to TOL (absolute). NotApplicable for a backend without `new_cache`
    (generate then recomputes the whole window every token)."""
    model = build_model(case)
    if not all(_decodes(type(block.attn)) for block in model.blocks):
        raise NotApplicable("no cache: generate recomputes (the backend defines no new_cache)")
    idx = torch.randint(0, model.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(1))
    schedules = {
        "token-by-token": [1] * T,
        "prefill-6": [6] + [1] * (T - 6),
        "chunked": [3, 4, 1, 2, 2],
        "one-shot": [T],
    }
    worst = 0.0
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
            worst = max(worst, err)
    return f"{len(schedules)} schedules, max |decoded - full| {worst:.1e}"


def unique_graphs(case: Case, n_layer: int) -> int:
    """Graphs dynamo captures (its eager backend: no code generation) for a forward and backward of a model of
    `n_layer` blocks, each block compiled, a recompile-limit hit made an error."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    model = GPT(model_config(case, n_layer=n_layer))
    for block in model.blocks:
        block.compile(backend="eager")
    torch._dynamo.reset()
    counters.clear()
    idx = torch.randint(0, model.config.vocab_size, (2, 16))
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        model(idx).float().mean().backward()
    return counters["stats"]["unique_graphs"]


def check_compile_graphs(case: Case, depths: tuple[int, int] = (3, 6)) -> str:
    """Compiled blocks share their graphs: as many unique graphs at the deeper depth as at the shallower one (a graph
    per layer would recompile per layer and, past dynamo's limit of 8, run eager silently)."""
    if case.config.get("layer_overrides"):
        raise NotApplicable("a hybrid case: its layers differ by design")
    shallow, deep = (unique_graphs(case, n) for n in depths)
    assert shallow == deep, (
        f"{case.id}: {shallow} compiled graphs at {depths[0]} layers but {deep} at {depths[1]}: the graph grows with "
        "the depth (a Python number of the layer baked in; read it from a tensor)"
    )
    return f"{deep} graphs at {depths[0]} and {depths[1]} layers"


def check_flops(case: Case) -> str:
    """The declared `forward_flops_per_token` x tokens within FLOPS_TOLERANCE of what `torch.utils.flop_counter`
    counts for one layer's forward at the full context (one sequence of block_size tokens), on the fast path or the
    math path (a path may spend more than the mechanism needs: padded value heads, an explicit reference; a count
    that matches neither is wrong). SDPA runs its math kernel here, whose products the counter sees (it counts none
    for the CPU flash kernel on torch <= 2.13). A layer that reads a fixed reference stream also projects it to q and
    k each forward: 2 x 2 C^2 per stream position, added to the declared count (as `model.flops` does per step)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    cls = attention.get_attention(case.backend)
    impls = ["sdpa", "math"] if "impl" in {f.name for f in dataclasses.fields(cls.Options)} else [None]
    counted: dict[str, int] = {}
    for impl in impls:
        model = build_model(case if impl is None else with_impl(case, impl), dtype=torch.float32)
        attn, n, C = model.blocks[layer_under_test(model, case)].attn, model.config.block_size, model.config.n_embd
        try:
            declared = cls.forward_flops_per_token(model.config, attn.options, n) * n
        except NotImplementedError as err:
            raise AssertionError(f"{case.id}: {err} (compute-matched budgets and MFU need it)") from None
        if cls.uses_reference_stream:
            declared += cls.reference_length(model.config, attn.options) * 2 * 2 * C * C
        x, emb = torch.randn(1, n, C), torch.randn(1, n, C)
        reference = [torch.randn(1, n, C) for _ in model.blocks]
        with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            attn(x, model.context(n, embeddings=emb, reference=reference))
        counted[impl or "its path"] = counter.get_total_flops()
    offs = {path: (declared - c) / max(c, 1) for path, c in counted.items()}
    shown = "; ".join(f"{path} path {counted[path]:,} ({off:+.1%})" for path, off in offs.items())
    assert min(abs(off) for off in offs.values()) <= FLOPS_TOLERANCE, (
        f"{case.id}: declares {declared:,} forward FLOPs for {n} tokens; the counter counts {shown}"
    )
    return f"declared {declared:,}; counted {shown}"


def check_parameters(case: Case) -> str:
    """Counts the parameters (one layer, the model; shared modules once) and checks every one is in a known
    gradient-norm group."""
    model = build_model(case)
    attn = model.blocks[layer_under_test(model, case)].attn
    for name, _ in attn.named_parameters():
        assert attn.parameter_group(name) in GROUPS, f"{case.id}: {name} in unknown group {attn.parameter_group(name)}"
    per_layer = sum(p.numel() for p in attn.parameters())
    total = sum(p.numel() for p in model.parameters())
    return f"one layer {per_layer:,}; tiny model {total:,}"


def check_state_dict(case: Case) -> str:
    """The model's state dict, saved and loaded back (weights_only) into a model of another init, gives the same
    outputs; every key loads (strict)."""
    model = build_model(case)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    other = build_model(case, seed=1)
    other.load_state_dict(torch.load(buffer, weights_only=True), strict=True)
    idx = torch.randint(0, model.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        err = (other(idx) - model(idx)).abs().max().item()
    assert err == 0.0, f"{case.id}: reloaded state dict gives other outputs (max |diff| {err:.3e}): a state is unsaved"
    return f"{len(model.state_dict())} tensors, outputs identical"


@functools.lru_cache(maxsize=1)
def text_bytes() -> torch.Tensor:
    """Real English/Python text: the pydoc topics that ship with CPython, as UTF-8 bytes (ids 0..255)."""
    from pydoc_data.topics import topics

    return torch.tensor(list("\n".join(topics[key] for key in sorted(topics)).encode("utf-8")[:300_000]))  # (N,)


def check_learns_bytes(case: Case) -> str:
    """The case's tiny GPT over bytes (fp32, its own init; its layers run the case's backend with the case's options)
    trained by AdamW (lr 3e-3) on LEARN_STEPS batches of 8 windows of T + 1 bytes of real text: every loss is finite
    and the mean of the last 5 is below 0.8 x the first."""
    torch.manual_seed(0)
    model = GPT(model_config(case, vocab_size=257))
    layers = layers_of(model, case)
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
    end = sum(losses[-5:]) / 5
    assert end < 0.8 * losses[0], f"{case.id}: the tiny GPT does not learn bytes: {losses}"
    return f"loss {losses[0]:.2f} -> {end:.2f} in {LEARN_STEPS} steps ({end / losses[0]:.2f}x, needs < 0.80x)"
