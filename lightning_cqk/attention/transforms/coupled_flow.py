"""The coupled flow of a free-MLP bank with a hand-written backward: the fast path of `qk_transform: {kind: coupled}`.

Paper: B. Gahtan and A. M. Bronstein, "Coupled Query-Key Dynamics for Attention", arXiv 2604.01683 v1 (2026); the
flow and its integrators are defined in `lightning_cqk.attention.transforms.dynamics` (module docstring). Per pair, with
the per-pair MLP f(x) = W2 silu(W1 x + b1) + b2 (written row-wise below, x W1 + b1) and h = dt / 2:

    leapfrog (n steps, forces F_j = f(q_j), j = 0..n):   a_i = k_i + h F_i,  q_{i+1} = q_i + dt a_i,
                                                          k_{i+1} = a_i + h F_{i+1}
    euler    (n steps, F_i = f(q_i), i = 0..n-1):         q_{i+1} = q_i + dt k_i,  k_{i+1} = k_i + dt F_i

Why a hand-written backward: plain autograd of these few small ops spends more time on elementwise passes over
(P, N, d) tensors than on the matmuls (a CPU profile at head size 64: every `addcmul` costs two scaled copies and a
product-and-sum for dt in backward, every `baddbmm` a bias reduction; with recompute="flow" the checkpoint reruns
all of it). The reverse sweep below computes the same gradients with the matmuls autograd does and far fewer passes:

    * the kick coefficient is folded into the small weight: dL/ds_j = (c_j G_j) W2^T = G_j (c_j W2)^T, where G_j is
      the gradient reaching F_j's kicks and c_j its coefficient (h at the ends of leapfrog, dt = 2h in between, dt for
      Euler), so dL/dF_j is never formed;
    * dt's share through a force comes from the weight-gradient matmul already done:
      <G_j, F_j> = <s_j^T G_j, W2> + <1^T G_j, b2>, s_j = silu(z_j), a contraction of two (P, hidden, d) matrices;
    * only the drifts need a pass over (P, N, d) for dt: <dL/dq_{i+1}, a_i> (leapfrog) or <dL/dq_{i+1}, k_i> (Euler);
    * the gradient of q accumulates in place (`baddbmm` with out=) into one contiguous buffer.

The forward is also the forward of `CoupledDynamics.flow` for a free-MLP bank (`integrate`, the path without gradients),
so a model computes the same q and k with and without grad. Each kick is k + c b2 + s (c W2) rather than k + c f(x),
which the implementation before this fast path computed: equal to round-off.
`tests/unit/attention/transforms/test_coupled_flow.py`
checks outputs and gradients (q, k, dt, every parameter; leapfrog and Euler; steps 1..3 and 7; dt per layer and per
pair) against a plain-autograd reference in fp64.

What backward keeps (`keep`): "inputs" (recompute="flow") keeps q_0 and, for leapfrog, the first kick a_0 (for
Euler k_0; for leapfrog too when k_0 is kept anyway: `keys_kept`, or k is q), as much memory as q_0 and k_0, and
recomputes the states in backward, skipping what a_0 already holds (the first force's output matmul) and what only
the outputs need (the last force's output matmul); the forces' s_j that the recompute does not need are computed in
backward into one buffer that then takes dL/ds_j and dL/dz_j in place. "all" (recompute="none", and "qk", whose
outer checkpoint reruns this forward anyway) keeps every state the sweep reads: q_j, z_j = q_j W1 + b1, s_j, and a_i
(leapfrog) or k_i (Euler).

Shapes: B batch, P pairs, T tokens, N = B*T, d head size, H hidden width. `coupled_mlp_flow` takes and returns
(B, P, T, d); inside, pairs first, q, k (P, N, d); w1 (P, d, H), b1 (P, H), w2 (P, H, d), b2 (P, d) or None;
dt () or (P, 1, 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def heads_first(x: torch.Tensor) -> torch.Tensor:
    """(B, P, T, d) -> (P, B*T, d) for matmuls batched over pairs; a view for the (B, T, P, d) memory layout."""
    B, P, T, d = x.shape
    return x.transpose(1, 2).reshape(B * T, P, d).transpose(0, 1)  # (P, B*T, d)


def heads_back(y: torch.Tensor, batch: int) -> torch.Tensor:
    """(P, B*T, d) -> (B, P, T, d), a view; the inverse of `heads_first`."""
    P, n, d = y.shape
    return y.unflatten(1, (batch, n // batch)).transpose(0, 1)  # (B, P, T, d)


def _empty_pairs_first(like: torch.Tensor) -> torch.Tensor:
    """An uninitialised (B, P, T, d) tensor (not a view) whose `heads_first` is a contiguous (P, B*T, d) view."""
    B, P, T, d = like.shape
    return torch.empty_strided((B, P, T, d), (T * d, B * T * d, d, 1), dtype=like.dtype, device=like.device)


def _pre(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor) -> torch.Tensor:
    """z = x W1 + b1, (P, N, d) -> (P, N, H): one batched matmul, bias fused."""
    return torch.baddbmm(b1.unsqueeze(1), x, w1)  # (P, N, H)


def _silu(z: torch.Tensor, record: bool) -> torch.Tensor:
    """silu(z), in place when neither the reverse sweep nor autograd needs z."""
    return F.silu(z, inplace=not record and not torch.is_grad_enabled())  # (P, N, H)


def _kick(k: torch.Tensor, coef: torch.Tensor, s: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor | None, out=None):
    """k + coef f(x) with s = silu(x W1 + b1), as (k + coef b2) + s (coef W2): the coefficient goes on the small
    weights and the matmul accumulates in place into a fresh tensor (or `out`, contiguous), so f(x) (P, N, d) is never
    formed."""
    if torch.is_grad_enabled():  # plain autograd, which takes no out=
        start = k if b2 is None else k + coef * b2.unsqueeze(1)  # (P, N, d)
        return torch.baddbmm(start, s, coef * w2)  # (P, N, d)
    # Contiguous (accumulating into a strided tensor would go through a hidden copy); out= rather than `baddbmm_`,
    # which torch.utils.flop_counter would not count.
    start = torch.empty(k.shape, dtype=k.dtype, device=k.device) if out is None else out  # (P, N, d)
    if b2 is None:
        start.copy_(k)
    else:
        torch.add(k, coef * b2.unsqueeze(1), out=start)
    return torch.baddbmm(start, s, coef * w2, out=start)  # (P, N, d)


def _leapfrog(
    q, k, dt, w1, b1, w2, b2, steps: int, record: bool, outputs: bool, out=None, first_kick=None, keep_first_kick=False
):
    """The leapfrog states; `record`: also return [q_j], [z_j], [s_j] (j = 0..n) and [a_i] (i < n);
    `keep_first_kick` (without `record`): the kicks list holds a_0 alone (what backward keeps with q_0 when it
    recomputes, `CoupledMLPFlow`).

    `outputs=False` (a recompute for backward) stops after z_n and records s_0 (with `first_kick`) and s_n as None:
    nothing but backward reads them, and `_Grads.force` computes them there into its one buffer. `out`: (q_n, k_n)
    are written there (contiguous (P, N, d) tensors; without grad only). `first_kick`: a_0, already known (k is then
    not read), so the recompute skips the first force's output matmul.
    """
    q_out, k_out = (None, None) if out is None else out
    qs, zs, ss, kicks = [], [], [], []
    half = 0.5 * dt
    z = _pre(q, w1, b1)  # (P, N, H)
    s = _silu(z, record) if first_kick is None else None  # (P, N, H)
    if record:
        qs.append(q), zs.append(z), ss.append(s)
    for i in range(steps):
        k = first_kick if i == 0 and first_kick is not None else _kick(k, half, s, w2, b2)  # a_i = k_i + h F_i
        if i == 0 and keep_first_kick:
            kicks.append(k)
        last = i == steps - 1
        q = torch.addcmul(q, dt, k) if q_out is None or not last else torch.addcmul(q, dt, k, out=q_out)  # q_{i+1}
        z = _pre(q, w1, b1)  # (P, N, H)
        # F_{i+1} serves this step's closing kick and the next opening one.
        s = None if last and not outputs else _silu(z, record)  # (P, N, H)
        if record:
            kicks.append(k), qs.append(q), zs.append(z), ss.append(s)
        if not outputs and last:
            return None, None, (qs, zs, ss, kicks)
        k = _kick(k, half, s, w2, b2, k_out if last else None)  # k_{i+1} = a_i + h F_{i+1}
    return q, k, (qs, zs, ss, kicks)


def _euler(q, k, dt, w1, b1, w2, b2, steps: int, record: bool, outputs: bool, out=None):
    """The Euler states; `record`: also return [q_i], [z_i], [s_i] and [k_i] (i < n).

    `outputs=False` stops after z_{n-1} (s_{n-1} recorded as None, as `_leapfrog`): the last force feeds only k_n,
    the last drift only q_n. `out` as `_leapfrog`.
    """
    q_out, k_out = (None, None) if out is None else out
    qs, zs, ss, ks = [], [], [], []
    for i in range(steps):
        last = i == steps - 1
        z = _pre(q, w1, b1)  # (P, N, H)
        s = None if last and not outputs else _silu(z, record)  # (P, N, H)
        if record:
            qs.append(q), zs.append(z), ss.append(s), ks.append(k)
        if not outputs and last:
            return None, None, (qs, zs, ss, ks)
        if q_out is not None and last:  # simultaneous: both from the old state
            q, k = torch.addcmul(q, dt, k, out=q_out), _kick(k, dt, s, w2, b2, k_out)
        else:
            q, k = torch.addcmul(q, dt, k), _kick(k, dt, s, w2, b2)
    return q, k, (qs, zs, ss, ks)


def integrate(q, k, dt, w1, b1, w2, b2, integrator: str, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_n, k_n), the forward of the fast path as plain ops (autograd can differentiate it; without grad it is the
    whole flow). Arguments as `coupled_mlp_flow`."""
    run = _leapfrog if integrator == "leapfrog" else _euler
    q, k, _ = run(q, k, dt, w1, b1, w2, b2, steps, False, True)
    return q, k


def _owned(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A copy of g (B, P, T, d) that the sweep may update in place (one pass, whatever g's layout), and its contiguous
    pairs-first view (P, B*T, d)."""
    own = _empty_pairs_first(g).copy_(g)  # (B, P, T, d)
    return own, heads_first(own)  # (P, B*T, d) view


def _pair_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """<a_p, b_p> per pair: (P, N, d) x (P, N, d) -> (P,); on CPU one dot product per pair when both are contiguous
    (no (P, N, d) product is formed; on a GPU that would be a kernel launch per pair)."""
    if a.device.type == "cpu" and a.is_contiguous() and b.is_contiguous():
        return torch.stack([torch.dot(x.view(-1), y.view(-1)) for x, y in zip(a, b)])  # (P,)
    return (a * b).sum((1, 2))  # (P,)


class _Grads:
    """Accumulators of the parameter gradients and of dt's per-pair gradient during the reverse sweep.

    `needs` (dt, w1, b1, w2, b2): which of them need a gradient; the others are neither computed nor returned.
    """

    def __init__(self, w1, b1, w2, b2, needs: tuple[bool, ...]) -> None:
        self.w1, self.b1, self.w2, self.b2 = w1, b1, w2, b2
        self.need_dt, self.need_w1, self.need_b1, self.need_w2, self.need_b2 = needs
        self.need_b2 = self.need_b2 and b2 is not None
        self.w1t = w1.transpose(1, 2).contiguous()  # (P, H, d)
        self.buffer: torch.Tensor | None = None  # (P, N, H): s_j when not recorded, then dL/ds_j, then dL/dz_j
        self.gw1 = self.gb1 = self.gw2 = self.gb2 = None
        self.gdt = torch.zeros(w1.size(0), dtype=w1.dtype, device=w1.device)  # (P,)

    @staticmethod
    def _add(acc, x):
        return x if acc is None else acc + x

    def drift(self, gq: torch.Tensor, velocity: torch.Tensor) -> None:
        """dt's share of a drift q' = q + dt v: <dL/dq', v> per pair."""
        if self.need_dt:
            self.gdt = self.gdt + _pair_dot(gq, velocity)

    def force(self, grad: torch.Tensor, coef: torch.Tensor, dcoef: float, q, z, s, gq):
        """Backward through a force F_j = f(q_j) whose kicks receive `grad` (P, N, d) with coefficient `coef` (P,) per
        pair (dL/dF_j = coef * grad; d coef / d dt = `dcoef`). Adds J_f(q_j)^T dL/dF_j to `gq` in place.

        `s` is silu(z_j), or None (not recorded): it is computed into the buffer, which then takes dL/ds_j and
        dL/dz_j in place, so no (P, N, H) tensor is allocated per force (a recorded s is never written: autograd may
        run this backward again with retain_graph)."""
        if self.buffer is None:
            self.buffer = torch.empty_like(z)  # (P, N, H)
        if s is None:
            s = torch.ops.aten.silu.out(z, out=self.buffer)  # (P, N, H)
        c3 = coef.view(-1, 1, 1)  # (P, 1, 1)
        if self.need_w2 or self.need_dt:
            m = torch.bmm(s.transpose(1, 2), grad)  # (P, H, d) = s_j^T G_j
            if self.need_w2:
                self.gw2 = self._add(self.gw2, c3 * m)
            if self.need_dt:
                self.gdt = self.gdt + dcoef * (m * self.w2).sum((1, 2))  # <s_j^T G_j, W2>
        if self.need_b2 or (self.need_dt and self.b2 is not None):
            r = grad.sum(1)  # (P, d) = 1^T G_j
            if self.need_b2:
                self.gb2 = self._add(self.gb2, coef.view(-1, 1) * r)
            if self.need_dt:
                self.gdt = self.gdt + dcoef * (r * self.b2).sum(1)  # <1^T G_j, b2>
        # s is no longer read: its buffer takes dL/ds_j, then dL/dz_j.
        gs = torch.bmm(grad, (c3 * self.w2).transpose(1, 2).contiguous(), out=self.buffer)  # (P, N, H) = dL/ds_j
        gz = torch.ops.aten.silu_backward.grad_input(gs, z, grad_input=gs)  # (P, N, H) = dL/dz_j
        if self.need_w1:
            self.gw1 = self._add(self.gw1, torch.bmm(q.transpose(1, 2), gz))  # (P, d, H)
        if self.need_b1:
            self.gb1 = self._add(self.gb1, gz.sum(1))  # (P, H)
        return torch.baddbmm(gq, gz, self.w1t, out=gq)  # (P, N, d), in place


def _leapfrog_backward(gq_out, gk_out, dt, w1, b1, w2, b2, states, needs) -> tuple:
    """dL/dq_0, dL/dk_0 (B, P, T, d) and the accumulators, from dL/dq_n, dL/dk_n (B, P, T, d) and the states."""
    qs, zs, ss, kicks = states
    n = len(kicks)
    dtv = dt.reshape(-1).expand(w1.size(0))  # (P,)
    half = 0.5 * dtv
    acc = _Grads(w1, b1, w2, b2, needs)
    ga = heads_first(gk_out)  # (P, N, d): dL/da_{n-1} through k_n (= dL/dk_n); a copy unless laid out for it
    gq_own, gq = _owned(gq_out)  # dL/dq, accumulated in place into gq (P, N, d), a view of gq_own
    for j in range(n, -1, -1):
        ends = j in (0, n)
        # F_j feeds the kicks around q_j: one (j = 0: a_0; j = n: k_n) or two (a_{j-1} -> k_j and k_j -> a_j).
        gq = acc.force(ga, half if ends else dtv, 0.5 if ends else 1.0, qs[j], zs[j], ss[j], gq)
        if j == 0:
            break
        # q_j = q_{j-1} + dt a_{j-1}: dt's share and dL/da_{j-1} = dL/dk_j + dt dL/dq_j (dL/dk_j = dL/da_j).
        acc.drift(gq, kicks[j - 1])
        ga = torch.addcmul(ga, dt, gq)
    return gq_own, heads_back(ga, gk_out.size(0)), acc


def _euler_backward(gq_out, gk_out, dt, w1, b1, w2, b2, states, needs) -> tuple:
    """As `_leapfrog_backward`, for Euler."""
    qs, zs, ss, ks = states
    dtv = dt.reshape(-1).expand(w1.size(0))  # (P,)
    acc = _Grads(w1, b1, w2, b2, needs)
    gq_own, gq = _owned(gq_out)  # dL/dq, accumulated in place into gq (P, N, d), a view of gq_own
    gk = heads_first(gk_out)  # (P, N, d)
    for i in range(len(qs) - 1, -1, -1):
        # q_{i+1} = q_i + dt k_i, k_{i+1} = k_i + dt F_i, both from the old state.
        acc.drift(gq, ks[i])
        gk_new = torch.addcmul(gk, dt, gq)  # dL/dk_i
        gq = acc.force(gk, dtv, 1.0, qs[i], zs[i], ss[i], gq)  # dL/dq_i
        gk = gk_new
    return gq_own, heads_back(gk, gk_out.size(0)), acc


class CoupledMLPFlow(torch.autograd.Function):
    """`steps` leapfrog or Euler steps of the free-MLP coupled flow, forward as `CoupledDynamics.flow`, backward by
    hand (module docstring). q, k and the outputs (B, P, T, d); `keep` is "inputs" (recompute in backward) or "all".

    The outputs are laid out pairs-first (their `heads_first` is contiguous, so the last kick and drift write them
    directly); dL/dq_n is copied once, whatever its layout, into the buffer that accumulates dL/dq.
    """

    @staticmethod
    def forward(ctx, q, k, dt, w1, b1, w2, b2, integrator: str, steps: int, keep: str, keys_kept: bool):
        run = _leapfrog if integrator == "leapfrog" else _euler
        record = keep == "all"
        q_n, k_n = _empty_pairs_first(q), _empty_pairs_first(k)  # (B, P, T, d), filled through their pairs-first views
        out = (heads_first(q_n), heads_first(k_n))  # (P, N, d) contiguous views
        # Leapfrog keeps a_0 instead of k_0 (the same size) unless k_0 is kept anyway (a tied v, or k is q).
        ctx.first_kick = run is _leapfrog and not record and not keys_kept and k is not q
        first = {"keep_first_kick": True} if ctx.first_kick else {}
        _, _, states = run(heads_first(q), heads_first(k), dt, w1, b1, w2, b2, steps, record, True, out, **first)
        ctx.run, ctx.steps, ctx.record, ctx.has_b2 = run, steps, record, b2 is not None
        params = (dt, w1, b1, w2) + ((b2,) if b2 is not None else ())
        if record:
            # States that are views of an input or an output (q_0, k_0; leapfrog's q_n) are saved as that tensor and
            # viewed again in backward: autograd refuses views made here (no grad) of what it then tracks.
            qs, zs, ss, other = states
            ends = (q, q_n) if run is _leapfrog else (q, k)
            qs, other = (qs[1:-1], other) if run is _leapfrog else (qs[1:], other[1:])
            ctx.counts = (len(qs), len(zs), len(ss), len(other))
            ctx.save_for_backward(*params, *ends, *qs, *zs, *ss, *other)
        else:
            ctx.save_for_backward(*params, q, states[3][0] if ctx.first_kick else k)
        return q_n, k_n

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gq_out, gk_out):
        saved = list(ctx.saved_tensors)
        n_params = 5 if ctx.has_b2 else 4
        dt, w1, b1, w2 = saved[:4]
        b2 = saved[4] if ctx.has_b2 else None
        rest = saved[n_params:]
        if ctx.record:
            first, second = heads_first(rest[0]), heads_first(rest[1])  # (P, N, d) views
            states, start = [], 2
            for count in ctx.counts:
                states.append(list(rest[start : start + count]))
                start += count
            qs, zs, ss, other = states
            if ctx.run is _leapfrog:  # first, second: q_0, q_n
                states = ([first, *qs, second], zs, ss, other)
            else:  # first, second: q_0, k_0
                states = ([first, *qs], zs, ss, [second, *other])
        else:
            with torch.no_grad():
                q = heads_first(rest[0])  # (P, N, d)
                if ctx.first_kick:  # rest[1]: a_0 (P, N, d); the recompute starts after the first kick
                    _, _, states = _leapfrog(q, None, dt, w1, b1, w2, b2, ctx.steps, True, False, first_kick=rest[1])
                else:  # rest[1]: k_0 (B, P, T, d)
                    k = heads_first(rest[1])  # (P, N, d)
                    _, _, states = ctx.run(q, k, dt, w1, b1, w2, b2, ctx.steps, True, False)
        sweep = _leapfrog_backward if ctx.run is _leapfrog else _euler_backward
        gq, gk, acc = sweep(gq_out, gk_out, dt, w1, b1, w2, b2, states, ctx.needs_input_grad[2:7])
        gdt = None if not acc.need_dt else acc.gdt.sum() if dt.dim() == 0 else acc.gdt.view(dt.shape)
        return gq, gk, gdt, acc.gw1, acc.gb1, acc.gw2, acc.gb2, None, None, None, None


def coupled_mlp_flow(
    q: torch.Tensor,
    k: torch.Tensor,
    dt: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    integrator: str,
    steps: int,
    keep: str = "inputs",
    keys_kept: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_n, k_n) (B, P, T, d) after `steps` steps of `integrator` (module docstring), with the hand-written backward.

    Args:
        q, k: (B, P, T, d) queries and keys (pairs-first inside: `heads_first`, a view for a projection's layout).
        dt: () or (P, 1, 1) step size, of q's dtype.
        w1, b1, w2, b2: the bank's weights in q's dtype, (P, d, H), (P, H), (P, H, d), (P, d) or None.
        integrator: "leapfrog" or "euler".
        steps: number of steps (>= 1).
        keep: "inputs" (backward recomputes the states) or "all" (backward reads them).
        keys_kept: k is kept by the caller for its own backward anyway (a tied v): with keep="inputs", leapfrog then
            keeps k_0 rather than its first kick a_0 (no extra memory, one more matmul in the recompute).
    """
    return CoupledMLPFlow.apply(q, k, dt, w1, b1, w2, b2, integrator, steps, keep, keys_kept)
