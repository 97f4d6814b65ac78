"""Inference: a trained model with its tokenizer (pretrained.py: the one checkpoint loader of generate, eval, glue,
mc-eval and downstream fine-tuning), sampling, batched generation with the KV cache (and its cache-free reference),
the `generate` command.

from lightning_cqk.inference import generate_all
new_ids = generate_all(model, [tokenizer.encode("Once upon")], max_new_tokens=50, temperature=0.8, top_k=40)
"""

from lightning_cqk.inference.generate import (
    CONTEXT_POLICIES,
    Step,
    generate,
    generate_all,
    generate_reference,
    max_new_tokens_that_fit,
)
from lightning_cqk.inference.pretrained import Pretrained, load_pretrained
from lightning_cqk.inference.sampling import SamplingConfig, filter_logits, make_generator, sample

__all__ = [
    "CONTEXT_POLICIES",
    "Pretrained",
    "SamplingConfig",
    "Step",
    "filter_logits",
    "generate",
    "generate_all",
    "generate_reference",
    "load_pretrained",
    "make_generator",
    "max_new_tokens_that_fit",
    "sample",
]
