"""The decoder model (torch only). `GPT(config)` maps token ids (B, T) to logits (B, T, vocab)."""

from lightning_cqk.model.decode import DecodeCache
from lightning_cqk.model.gpt import GPT, Block

__all__ = ["GPT", "Block", "DecodeCache"]
