"""A checkpoint's model settings as the defaults of a trainer command: what `--ckpt_path` brings to the parser.

Lightning's own `_parse_ckpt_path` puts the checkpoint's hyper-parameters over the whole command line; here they are
the defaults (inserted right after the subcommand, so every `--config` file and flag wins) and every explicit value
that differs from the checkpoint is returned as a change (fit: checked against the resume policy by the run's
preflight, `run/preflight.py`) or refused (the architecture, for evaluation too). The checkpoint is data: a
`class_path` anywhere in its settings is refused, and a plugin backend it names is imported only when installed or
trusted.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from lightning_cqk.attention.registry import check_recorded
from lightning_cqk.checkpoint.reading import CorruptCheckpointError, load_checkpoint
from lightning_cqk.cli import class_paths
from lightning_cqk.errors import ConfigError
from lightning_cqk.model_config import upgrade_config_dict
from lightning_cqk.run.directory import changed_settings, describe_changes


def merge_checkpoint_settings(
    parser: Any, config: Any, argv: list[str], sub: str | None, ckpt: str
) -> tuple[Any, dict[str, tuple[Any, Any]]]:
    """(the command's settings with the checkpoint's as defaults, or None when unchanged; {setting: (checkpoint's,
    this run's)} for every explicit value that differs)."""
    try:  # an untrusted file is refused here, before anything is built (UntrustedCheckpointError)
        hparams = load_checkpoint(ckpt, verify=False).get("hyper_parameters") or {}
    except (CorruptCheckpointError, OSError, AttributeError):  # named when it is loaded for real (CRCs checked)
        return None, {}
    hparams = {k: v for k, v in hparams.items() if k in ("config", "optim", "compile")}
    try:  # data, never code: a class_path anywhere in them is refused before the parser sees them
        class_paths.refuse_class_specs(hparams, f"The checkpoint {ckpt}")
    except class_paths.PlainDataError as err:
        sys.exit(f"lightning_cqk {sub}: {err}")
    if isinstance(hparams.get("config"), dict):  # a checkpoint of an older version: today's field names
        hparams["config"] = upgrade_config_dict(hparams["config"])
        typed = (config[sub] if sub else config).get("model.config")
        try:  # a plugin it names is imported only when installed or trusted, or typed again now
            check_recorded(hparams["config"], f"The checkpoint {ckpt}", typed)
        except ConfigError as err:
            sys.exit(f"lightning_cqk {sub}: {err}")
    if not hparams or sub not in argv:
        return None, {}
    at = argv.index(sub) + 1
    try:
        merged = parser.parse_args([*argv[:at], f"--model={json.dumps(hparams)}", *argv[at:]])
    except SystemExit:  # settings this version does not know: the command line alone builds the model, and the
        print(  # checkpoint's architecture is still checked field by field when its weights load
            f"note: the settings saved in {ckpt} do not parse with this version; the command line's are used.",
            file=sys.stderr,
        )
        return None, {}
    model = merged[sub].model
    now_ = {k: model[k].as_dict() if hasattr(model[k], "as_dict") else model[k] for k in hparams}
    if isinstance(now_.get("config"), dict):  # compared in today's field names, as the checkpoint's are
        now_["config"] = upgrade_config_dict(now_["config"])
    changes = changed_settings({"model": hparams}, {"model": now_})
    for linked in ("model.config.vocab_size", "model.config.block_size"):  # checked when the weights load
        changes.pop(linked, None)
    if sub != "fit":
        arch = {k: v for k, v in changes.items() if k.startswith("model.config.") and k != "model.config.dropout"}
        if arch:
            sys.exit(
                f"lightning_cqk {sub}: the checkpoint {ckpt} holds another model than this command asks for "
                f"({describe_changes(arch)}). Drop {' '.join('--' + k for k in arch)} (and any config file "
                "setting them): the checkpoint's own settings are used."
            )
    return merged, changes
