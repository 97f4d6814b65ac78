"""`CQKLM`: a checkpoint of this framework as an lm-evaluation-harness model, registered as ``"lightning_cqk"``.

    import lightning_cqk.evaluation.lm  # registers the class
    lm_eval.simple_evaluate(model="lightning_cqk", model_args={"checkpoint": "runs/.../last.ckpt"}, tasks=[...])

The three request types of lm-eval's ``LM`` (lm_eval/api/model.py), with lm-eval's conventions (docs/evaluation.md):

* ``loglikelihood(context, continuation)``: lm-eval's ``TemplateLM`` tokenises the pair (trailing whitespace of the
  context moves to the continuation; ``context + continuation`` is tokenised whole and split after the context's
  tokens; an empty context, or one of whitespace alone, becomes EOS) and `scoring.score_continuations` scores it in
  the last ``block_size + 1`` tokens. ``prefix_eos=True`` also puts EOS before every non-empty context (mc-eval's
  convention; the document boundary these models saw before every pre-training document); the default, False, is
  lm-eval's convention for GPT-2-style tokenizers, which add no BOS, so numbers compare with the harness's published
  ones.
* ``loglikelihood_rolling(text)``: lm-eval's rolling windows (``get_rolling_token_windows`` with context_len 1,
  ``make_disjoint_window``): EOS, then chunks of ``block_size`` tokens each predicted once; the last window reads a
  full ``block_size`` context and scores only its new tokens. The sum over the document.
* ``generate_until(context, gen_kwargs)``: `lightning_cqk.inference.generate` with the KV cache, batched (left
  padding; finished rows leave the batch), until a stop sequence of ``until`` appears in the decoded text, EOS is
  produced, or ``max_gen_toks`` tokens; the text is cut before the first stop sequence. Greedy unless
  ``do_sample`` (then ``temperature``, ``top_k``, ``top_p``, from one generator per call seeded by ``seed``). The
  context keeps its last ``block_size - max_gen_toks`` tokens.

Requests are batched ``batch_size`` at a time, longest first; the model runs in ``dtype`` on ``device``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import normalize_gen_kwargs
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from lightning_cqk.data.tokenizers import Tokenizer, get_tokenizer
from lightning_cqk.evaluation.scoring import score_continuations
from lightning_cqk.inference.generate import generate_all
from lightning_cqk.inference.sampling import make_generator

logger = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
_GEN_KEYS = {"until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p"}


def _flag(value: Any) -> bool:
    """A boolean model argument, also from lm-eval's ``key=value`` strings."""
    if isinstance(value, str):
        if value.lower() in ("true", "1", "yes"):
            return True
        if value.lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"Expected true or false, got {value!r}.")
    return bool(value)


@register_model("lightning_cqk")
class CQKLM(TemplateLM):
    """A `GPT` of this framework with its training tokenizer, as an lm-eval model; see the module docstring.

    Args:
        checkpoint: a ``.ckpt`` written by ``lightning_cqk fit`` (the model and its tokenizer are read from it by
            `lightning_cqk.inference.pretrained.load_pretrained`).
        model: instead of a checkpoint, a GPT (``context_length`` and ``config.vocab_size`` are read from it)...
        tokenizer: ...with its tokenizer (a `Tokenizer`, or a name); with a checkpoint, a name that must be the
            recorded one (default: read from the checkpoint).
        bpe_file: local vocabulary file of a BPE tokenizer.
        batch_size: sequences per forward (lm-eval's ``auto`` is not supported: give a number).
        max_batch_size: only meaningful with ``batch_size=auto``; must stay unset.
        device: torch device (default: cuda when available, else cpu).
        dtype: float32 | bfloat16 | float16 | float64, the model's weights and compute.
        prefix_eos: put EOS before every context (mc-eval's convention); default lm-eval's (EOS only before an empty
            context, and before every rolling-loglikelihood document).
        max_gen_toks: generation budget of tasks that do not set one (default: min(256, block_size // 2)).
        seed: seed of the sampling generator (``do_sample`` tasks).
    """

    def __init__(
        self,
        checkpoint: str | None = None,
        model: torch.nn.Module | None = None,
        tokenizer: Tokenizer | str | None = None,
        bpe_file: str | None = None,
        batch_size: int | str = 16,
        max_batch_size: int | None = None,
        device: str | None = None,
        dtype: str = "float32",
        prefix_eos: bool | str = False,
        max_gen_toks: int | None = None,
        seed: int = 1234,
    ) -> None:
        super().__init__()
        if (checkpoint is None) == (model is None):
            raise ValueError("Give either checkpoint=<path to a .ckpt> or model=<GPT> (with tokenizer=), not both.")
        if isinstance(batch_size, str) and not batch_size.strip().isdigit():
            raise ValueError(
                f"batch_size={batch_size!r} is not supported by the lightning_cqk model (no automatic batch size "
                "search); give a number, e.g. --batch_size 16."
            )
        if max_batch_size is not None:
            raise ValueError("max_batch_size only applies to batch_size=auto, which lightning_cqk does not do.")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}.")
        self.batch_size = int(batch_size)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}.")
        self.checkpoint = checkpoint
        if checkpoint is not None:
            from lightning_cqk.inference.pretrained import load_pretrained

            if tokenizer is not None and not isinstance(tokenizer, str):
                raise ValueError("With a checkpoint, tokenizer is a name (default: the checkpoint's own).")
            pretrained = load_pretrained(checkpoint, tokenizer=tokenizer, bpe_file=bpe_file)
            model, tok = pretrained.model, pretrained.tokenizer
        else:
            if tokenizer is None:
                raise ValueError("model= needs tokenizer= (a lightning_cqk Tokenizer or its name).")
            tok = get_tokenizer(tokenizer, bpe_file) if isinstance(tokenizer, str) else tokenizer
        config = model.config
        if tok.vocab_size != config.vocab_size:
            raise ValueError(
                f"The tokenizer has {tok.vocab_size:,} ids but the model's vocabulary is {config.vocab_size:,}: use "
                "the tokenizer the model was trained with."
            )
        self._device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype_name = dtype
        self.model = model.to(device=self._device, dtype=DTYPES[dtype]).eval()
        self.tok = tok
        # The window: block_size, or a shorter fixed reference stream (`GPT.context_length`).
        self.block_size = int(getattr(model, "context_length", config.block_size))
        self.vocab_size = int(config.vocab_size)
        self.prefix_eos = _flag(prefix_eos)
        self.max_gen_toks = int(max_gen_toks) if max_gen_toks is not None else min(256, self.block_size // 2)
        self.seed = int(seed)
        self.truncated = {"loglikelihood": 0, "generate_until": 0}  # requests whose context lost its start

    # ------------------------------------------------------------------------------------- tokenisation
    @property
    def eot_token_id(self) -> int:
        return self.tok.eos_id

    @property
    def max_length(self) -> int:
        return self.block_size

    @property
    def tokenizer_name(self) -> str:
        return f"lightning_cqk-{self.tok.name}-{self.tok.fingerprint[:12]}"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """The tokenizer's ids (it never adds special tokens)."""
        return self.tok.encode(string)

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return self.tok.decode([t for t in tokens if t != self.tok.eos_id])

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        context_enc, continuation_enc = super()._encode_pair(context, continuation)
        if self.prefix_eos or not context_enc:  # a context of whitespace alone is empty once it moved: as lm-eval's ""
            context_enc = [self.eot_token_id, *context_enc]
        return context_enc, continuation_enc

    def _context_ids(self, context: str) -> list[int]:
        """A generation prompt's ids: EOS first when ``prefix_eos`` or when the context is empty."""
        ids = self.tok_encode(context)
        return [self.eot_token_id, *ids] if self.prefix_eos or not ids else ids

    # ------------------------------------------------------------------------------------- log-likelihoods
    def _loglikelihood_tokens(self, requests: list, disable_tqdm: bool = False, **kwargs: Any) -> list[tuple]:
        """``requests``: ``((context, continuation), context_ids, continuation_ids)`` from ``TemplateLM``."""
        pairs = [(ctx, cont) for _, ctx, cont in requests]
        self._note_truncation("loglikelihood", [len(c) + len(k) - 1 for c, k in pairs], self.block_size)
        with tqdm(total=len(pairs), disable=disable_tqdm, desc="lightning_cqk loglikelihood") as bar:
            results = score_continuations(self.model, pairs, self.block_size, self.batch_size, bar.update)
        for (key, _, _), result in zip(requests, results):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
        return results

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        windows, owner = [], []
        for n, (text,) in enumerate(req.args for req in requests):
            for window in get_rolling_token_windows(
                token_list=self.tok_encode(text),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.block_size,
                context_len=1,
            ):
                windows.append(make_disjoint_window(window))
                owner.append(n)
        with tqdm(total=len(windows), disable=disable_tqdm, desc="lightning_cqk loglikelihood_rolling") as bar:
            scored = score_continuations(self.model, windows, self.block_size, self.batch_size, bar.update)
        totals = [0.0] * len(requests)
        for n, (logprob, _) in zip(owner, scored):
            totals[n] += logprob
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # ------------------------------------------------------------------------------------- generation
    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        results: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for n, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(n)
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="lightning_cqk generate_until")
        # One generator for the whole call: a fresh one per batch would give every batch the same draws (lm-eval's
        # `repeats` send k identical requests, which then came back as copies of the first batch's samples).
        generator = make_generator(self.seed, self._device)
        for members in groups.values():
            settings = self._generation_settings(requests[members[0]].args[1])
            budget = settings["max_gen_toks"]
            full = {n: self._context_ids(requests[n].args[0]) for n in members}
            prompts = {n: ids[-(self.block_size - budget) :] for n, ids in full.items()}
            self._note_truncation("generate_until", [len(ids) for ids in full.values()], self.block_size - budget)
            order = sorted(members, key=lambda n: (-len(prompts[n]), n))
            for start in range(0, len(order), self.batch_size):
                batch = order[start : start + self.batch_size]
                texts = self.generate_texts([prompts[n] for n in batch], **settings, generator=generator)
                for n, text in zip(batch, texts):
                    results[n] = text
                    self.cache_hook.add_partial("generate_until", requests[n].args, text)
                bar.update(len(batch))
        bar.close()
        return results  # type: ignore[return-value]

    def _generation_settings(self, gen_kwargs: dict) -> dict[str, Any]:
        """A task's generation_kwargs as `generate_texts` arguments; settings this model cannot apply are refused."""
        if not isinstance(gen_kwargs, dict):
            raise ValueError(f"generate_until expects a dict of generation settings, got {gen_kwargs!r}.")
        kwargs = dict(normalize_gen_kwargs(gen_kwargs, self.max_gen_toks))
        unknown = sorted(set(kwargs) - _GEN_KEYS)
        if unknown:
            raise ValueError(
                f"Generation settings {unknown} cannot be applied by the lightning_cqk model (it supports "
                f"{sorted(_GEN_KEYS)}). Copy the task's YAML into a folder, remove them there and pass it with "
                "--include_path <folder>."
            )
        until = kwargs["until"] or []
        until = [until] if isinstance(until, str) else list(until)
        budget = int(kwargs["max_gen_toks"])
        if not 0 < budget < self.block_size:
            raise ValueError(
                f"max_gen_toks={budget} must lie in 1..{self.block_size - 1}: the prompt and the generated tokens "
                f"share this model's block_size of {self.block_size} tokens. Add --gen_kwargs "
                f"max_gen_toks={max(1, self.block_size // 2)}."
            )
        sample = bool(kwargs.get("do_sample"))
        top_k = kwargs.get("top_k")
        top_p = kwargs.get("top_p")
        return {
            "until": until,
            "max_gen_toks": budget,
            "temperature": float(kwargs.get("temperature") or 0.0) if sample else 0.0,
            "top_k": int(top_k) if sample and top_k else None,  # HF's top_k=0: no top-k filtering
            "top_p": float(top_p) if sample and top_p is not None else None,
        }

    def generate_texts(
        self,
        prompts: list[list[int]],
        until: list[str],
        max_gen_toks: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
    ) -> list[str]:
        """The text generated after each prompt (token ids), cut before the first stop sequence of ``until``.
        Sampling draws from ``generator`` (default: a fresh one seeded by ``seed``)."""
        eos = self.eot_token_id
        stops = [s for s in until if s]

        def stop(row: int, tokens: list[int]) -> bool:
            return any(s in self.tok_decode(tokens) for s in stops)

        generated = generate_all(
            self.model,
            prompts,
            max_gen_toks,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=self.seed,
            generator=generator,
            eos_id=eos,
            stop=stop if stops else None,
        )
        texts = []
        for tokens in generated:
            text = self.tok_decode(tokens[:-1] if tokens and tokens[-1] == eos else tokens)
            for s in stops:
                text = text.split(s)[0]
            texts.append(text)
        return texts

    def _note_truncation(self, kind: str, lengths: list[int], room: int) -> None:
        """Count (and log) the requests whose context does not fit and loses tokens from its start."""
        n = sum(length > room for length in lengths)
        if n:
            self.truncated[kind] += n
            logger.warning(
                "%d of %d %s requests do not fit in %d tokens (block_size %d): their contexts lose tokens from the "
                "start (lm-eval's convention; counted in the results' config.truncated_requests).",
                n,
                len(lengths),
                kind,
                room,
                self.block_size,
            )

    def get_model_info(self) -> dict[str, Any]:
        """What lm-eval records under ``config`` in the results."""
        config = self.model.config
        return {
            "checkpoint": str(Path(self.checkpoint).resolve()) if self.checkpoint else None,
            "attention": config.attention,
            "block_size": self.block_size,
            "tokenizer": self.tok.name,
            "dtype": self.dtype_name,
            "prefix_eos": self.prefix_eos,
            "max_gen_toks": self.max_gen_toks,
            "model_num_parameters": sum(p.numel() for p in self.model.parameters()),
            "truncated_requests": dict(self.truncated),
        }
