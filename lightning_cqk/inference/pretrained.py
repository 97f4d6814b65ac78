"""Load a language model this framework trained (a `LitLM` checkpoint, any attention backend) with its tokenizer.

A checkpoint written by ``lightning_cqk fit`` carries what is needed to rebuild the model and to find its tokenizer:

* ``hyper_parameters.config``: the ``ModelConfig`` as a plain dict (attention backend, options, sizes), from which
  ``GPT`` is rebuilt exactly (``LitLM`` stores it that way);
* ``datamodule_hyper_parameters``: the data module's arguments, among them ``tokenizer``, ``bpe_file`` and
  ``data_dir``; the shards' ``manifest.json`` there (when it is still readable) records the vocabulary fingerprint.

Every command that reads a trained model (`generate`, `eval`, `glue`, `mc-eval`, downstream `--model.checkpoint`)
loads it here, through `lightning_cqk.checkpoint.reading.load_checkpoint`: `torch.load(weights_only=True)`, so a file
from elsewhere cannot run code while it loads (docs/reliability.md, "Checkpoints from elsewhere").

The tokenizer used downstream must be the one the model was trained with: a different tokenizer name, a vocabulary
size that differs from the model's embedding, or a vocabulary whose fingerprint differs from the one in the training
data's manifest is refused with an error saying which and how to fix it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_cqk.attention.registry import check_recorded
from lightning_cqk.checkpoint.reading import load_checkpoint, refuse_checkpoint_folder
from lightning_cqk.data.manifest import Manifest
from lightning_cqk.data.tokenizers import Tokenizer, get_tokenizer, vocab_size_of
from lightning_cqk.errors import ConfigError, MissingInputError
from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig, upgrade_config_dict


@dataclass
class Pretrained:
    """A rebuilt language model with the tokenizer it was trained with.

    Attributes:
        model: the GPT, weights loaded, in eval mode, on the CPU.
        config: its ModelConfig.
        tokenizer: the training tokenizer.
        path: the checkpoint file.
        fingerprint_checked: whether the tokenizer's vocabulary was compared with the training data's manifest.
        tokens_seen: tokens the LM was trained on (0 when the checkpoint does not say).
    """

    model: GPT
    config: ModelConfig
    tokenizer: Tokenizer
    path: Path
    fingerprint_checked: bool
    tokens_seen: int = 0


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint's dict (on the CPU), with a clear error when it is missing, truncated, corrupt, untrusted or not
    a `LitLM` checkpoint (read by `checkpoint_files.load_checkpoint`: weights_only=True, zip CRCs checked)."""
    path = Path(path)
    refuse_checkpoint_folder(path)
    if not path.is_file():
        raise MissingInputError(
            f"Checkpoint {path} does not exist. Give a .ckpt written by `lightning_cqk fit`, e.g. "
            "runs/<experiment>/<run>/checkpoints/last.ckpt."
        )
    checkpoint = load_checkpoint(path)
    hparams = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
    if not isinstance(hparams, dict) or not isinstance(hparams.get("config"), dict) or "state_dict" not in checkpoint:
        raise ConfigError(
            f"{path} is not a lightning_cqk language-model checkpoint (no hyper_parameters.config / state_dict); "
            "generate, eval, glue, mc-eval and downstream fine-tuning start from a LitLM checkpoint written by "
            "`lightning_cqk fit`."
        )
    return checkpoint


def load_pretrained(
    path: str | Path, tokenizer: str | None = None, bpe_file: str | None = None, check_fingerprint: bool = True
) -> Pretrained:
    """Rebuild the GPT of a `LitLM` checkpoint and the tokenizer it was trained with.

    Args:
        path: the ``.ckpt`` file.
        tokenizer: tokenizer name; None takes the one recorded in the checkpoint. Giving one that differs from the
            recorded one is an error (the model's ids would mean other text).
        bpe_file: local vocabulary file for BPE tokenizers; None uses the recorded one when it exists here, else
            ``$LIGHTNING_CQK_GPT2_BPE``.
        check_fingerprint: compare the tokenizer's vocabulary with the training data's manifest when it is readable.

    Raises:
        ConfigError (a ValueError): a tokenizer that is not the training one, or whose vocabulary size is not the
            model's.
    """
    path = Path(path)
    checkpoint = read_checkpoint(path)
    saved = upgrade_config_dict(checkpoint["hyper_parameters"]["config"])
    check_recorded(saved, f"The checkpoint {path}")  # a plugin imported only when installed or trusted
    config = ModelConfig(**saved)
    data_hparams = checkpoint.get("datamodule_hyper_parameters") or {}
    recorded = data_hparams.get("tokenizer")
    if tokenizer is not None and recorded is not None and tokenizer != recorded:
        raise ConfigError(
            f"{path} was trained with the {recorded!r} tokenizer, but tokenizer={tokenizer!r} was asked for: token ids "
            f"would mean different text. Leave the tokenizer unset (read from the checkpoint) or use {recorded!r}."
        )
    name = tokenizer or recorded
    if name is None:
        raise ConfigError(
            f"{path} does not record its tokenizer (no datamodule_hyper_parameters.tokenizer: it was not trained "
            "through `lightning_cqk fit`). Name it: --model.tokenizer bytes|gpt2 (`lightning_cqk fit` with a GLUE "
            "config), or `lightning_cqk mc-eval ... --tokenizer bytes|gpt2`."
        )
    if vocab_size_of(name) != config.vocab_size:
        raise ConfigError(
            f"Tokenizer {name!r} has {vocab_size_of(name):,} ids but the model in {path} has a vocabulary of "
            f"{config.vocab_size:,} (model.config.vocab_size): it was trained with another tokenizer. Use the "
            "tokenizer the checkpoint was trained with."
        )
    recorded_bpe = data_hparams.get("bpe_file")
    if bpe_file is None and recorded_bpe and Path(recorded_bpe).is_file():
        bpe_file = recorded_bpe
    tok = get_tokenizer(name, bpe_file)
    checked = False
    data_dir = data_hparams.get("data_dir")
    if check_fingerprint and isinstance(data_dir, str) and "://" not in data_dir and Manifest.exists(data_dir):
        manifest = Manifest.load(data_dir)
        if manifest.tokenizer_fingerprint != tok.fingerprint:
            raise ConfigError(
                f"The {name!r} vocabulary loaded here (fingerprint {tok.fingerprint[:12]}) is not the one {path} was "
                f"trained with ({manifest.tokenizer_fingerprint[:12]}, {data_dir}/manifest.json). Give the training "
                "vocabulary file (bpe_file / $LIGHTNING_CQK_GPT2_BPE)."
            )
        checked = True
    model = GPT(config)
    state = {k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items() if k.startswith("model.")}
    model.load_state_dict(state, strict=True)
    model.eval()
    return Pretrained(model, config, tok, path, checked, int(checkpoint.get("tokens_seen", 0)))
