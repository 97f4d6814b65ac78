"""Sigmoid attention for lightning_cqk, as a plugin (entry point `sigmoid` of group `lightning_cqk.attention`)."""
