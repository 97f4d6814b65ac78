"""`MatchedRMSNorm`: `nn.RMSNorm` that applies its gain in the input's dtype, so the fused kernel runs under autocast.

QK-norm and MLA's latent norms normalise the outputs of linear layers: bf16 under autocast, while the gain is an fp32
parameter. `F.rms_norm` with a bf16 input and an fp32 weight cannot dispatch to its fused implementation and falls
back to the composite one (several kernels, a warning on CPU). Casting the gain to the input's dtype (a copy of hs
elements; its gradient flows back to the fp32 parameter) keeps the fused kernel. Without autocast, and in fp64 for
the tests, the cast is a no-op and the module is `nn.RMSNorm` exactly (same parameter, same state-dict key).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MatchedRMSNorm(nn.RMSNorm):
    """RMSNorm over the last dimension(s): x / rms(x) * g, with g taken in x's dtype (module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight if self.weight is None or self.weight.dtype == x.dtype else self.weight.to(x.dtype)
        return F.rms_norm(x, self.normalized_shape, weight, self.eps)
