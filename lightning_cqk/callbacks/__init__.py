"""Callbacks that watch training from the side (Lightning-aware)."""

from lightning_cqk.callbacks.summary import RunSummary

__all__ = ["RunSummary"]
