"""Helpers of the lm-eval tests: a tiny fp64 GPT over bytes, its checkpoint, and tiny lm-eval tasks defined here
from local jsonl files (multiple choice, rolling log-likelihood, generation)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig

BLOCK = 16

MC_ITEMS = [
    {"context": "the cat sat on the", "choices": ["mat", "dog", "a long answer"], "label": 0},
    {"context": "good great fine", "choices": ["nice", "bad"], "label": 0},
    {"context": "2 + 2 =", "choices": ["4", "five", "22"], "label": 1},
    {"context": "a question whose context is longer than the block", "choices": ["yes", "no"], "label": 1},
]
DOCS = ["short doc.", "a document of more than two blocks of sixteen bytes, read in rolling windows", "x"]
GEN_ITEMS = [{"prompt": "the cat", "answer": "sat"}, {"prompt": "1 2 3", "answer": " 4"}]


def tiny_gpt(block_size: int = BLOCK, seed: int = 0) -> GPT:
    """A 2-layer RoPE GPT over bytes, fp64, eval mode."""
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=257, n_layer=2, n_embd=32, n_head=4, mlp_hidden=64, block_size=block_size)
    return GPT(config).double().eval()


def save_checkpoint(model: GPT, path: Path) -> Path:
    """What `lightning_cqk fit` writes and `load_pretrained` reads (checkpoints of real runs: tests/e2e/downstream)."""
    state = {f"model.{k}": v.float() for k, v in model.state_dict().items()}
    torch.save(
        {
            "hyper_parameters": {"config": model.config.to_dict()},
            "datamodule_hyper_parameters": {"tokenizer": "bytes"},
            "state_dict": state,
        },
        path,
    )
    return path


def write_tasks(root: Path) -> Path:
    """Three lm-eval tasks on local jsonl files: toy_mc (multiple_choice), toy_rolling, toy_gen (generate_until)."""
    root.mkdir(parents=True, exist_ok=True)
    data = {"mc": MC_ITEMS, "docs": [{"text": t} for t in DOCS], "gen": GEN_ITEMS}
    for name, rows in data.items():
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache = root / "hf-cache"  # the datasets library's cache of the parsed files stays in the test's folder
    tasks = {
        "toy_mc": f"""
task: toy_mc
dataset_path: json
dataset_kwargs:
  data_files: {{test: {root / "mc.jsonl"}}}
  cache_dir: {cache}
output_type: multiple_choice
test_split: test
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
  - metric: acc_norm
  - metric: acc_bytes
""",
        "toy_rolling": f"""
task: toy_rolling
dataset_path: json
dataset_kwargs:
  data_files: {{test: {root / "docs.jsonl"}}}
  cache_dir: {cache}
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
""",
        "toy_gen": f"""
task: toy_gen
dataset_path: json
dataset_kwargs:
  data_files: {{test: {root / "gen.jsonl"}}}
  cache_dir: {cache}
output_type: generate_until
test_split: test
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 5
  do_sample: false
metric_list:
  - metric: exact_match
""",
    }
    for name, text in tasks.items():
        (root / f"{name}.yaml").write_text(text.lstrip())
    return root
