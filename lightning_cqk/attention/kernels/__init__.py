"""Shared compute of the backends: causal scaled-dot-product attention, fused and reference (functional.py), and an
RMSNorm whose gain runs in the input's dtype (matched_norm.py)."""
