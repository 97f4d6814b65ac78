"""Which classes a config file, a flag or a checkpoint may name: the allow-list of what jsonargparse may instantiate.

jsonargparse builds a class from a `{class_path: ..., init_args: ...}` value in two places:

1. where the key's declared type is a class (`trainer.callbacks`, `trainer.logger`, `trainer.plugins`, `data`,
   ...): it imports the module that `class_path` names and builds the class when it is a subclass of that type;
2. inside any value whose declared type is `Any` (`model.config.attention_options` is `dict[str, Any]`): it imports
   and builds whatever the value names, `subprocess.Popen` included, with no type to check it against.

Both are closed here, for every jsonargparse parser of the package (`install()`, called by each command before it
parses anything):

- **A value typed `Any` is plain data.** A `class_path` anywhere inside one is refused (`PlainDataError`, a
  `ValueError` that jsonargparse reports under the key) and nothing is imported. Attention options, the only such
  values, are numbers, strings, booleans, lists and dicts of those.
- **A class path must be in the allow-list** (`TRUSTED_MODULES`: this package, Lightning, torch, torchmetrics and
  jsonargparse itself), checked by name *before* its module is imported, so a module outside it never runs. A
  researcher's own callbacks or data modules are added by naming their top-level package in the environment
  variable `LIGHTNING_CQK_TRUSTED_MODULES` (comma-separated, e.g. `LIGHTNING_CQK_TRUSTED_MODULES=mylab`).

A checkpoint's hyper-parameters are data too: `refuse_class_specs` checks them (`cli/trainer.py`,
`_merge_checkpoint_hparams`) before they are compared with the command line's and merged under it, and a checkpoint
that names a class anywhere in them is refused by name before anything is parsed, imported or built.
Tests: `tests/reliability/test_untrusted_checkpoints.py` (issue 34, defect 1).
"""

from __future__ import annotations

from typing import Any

from lightning_cqk.environment import env_modules

TRUSTED_MODULES = ("lightning_cqk", "lightning", "pytorch_lightning", "lightning_fabric", "torch", "torchmetrics",
                   "jsonargparse")  # fmt: skip
TRUSTED_ENV = "LIGHTNING_CQK_TRUSTED_MODULES"


class PlainDataError(ValueError):
    """A `class_path` inside a value that must be plain data (a key typed `Any`)."""


class UntrustedClassError(ValueError):
    """A `class_path` outside the allow-list of modules."""


def trusted_modules() -> tuple[str, ...]:
    """The allow-list: the package's own and its libraries' top-level modules, plus `$LIGHTNING_CQK_TRUSTED_MODULES`."""
    return (*TRUSTED_MODULES, *env_modules(TRUSTED_ENV))


def check_class_path(name: Any) -> None:
    """Refuse an import path whose top-level module is not in the allow-list (before anything is imported)."""
    if not isinstance(name, str):
        return
    root = name.split(".", 1)[0]
    if root in trusted_modules():
        return
    raise UntrustedClassError(
        f"class_path {name!r} is not in the allow-list of modules a config, flag or checkpoint may name "
        f"({', '.join(trusted_modules())}): importing it would run its code. If it is your own, trusted code, add its "
        f"package: export {TRUSTED_ENV}={root}"
    )


def find_class_spec(value: Any, where: str = "") -> str | None:
    """The dotted key of the first `{class_path: ...}` inside `value` (a dict or list tree), or None."""
    if isinstance(value, dict):
        if "class_path" in value:
            return where or "(the value itself)"
        for key, sub in value.items():
            found = find_class_spec(sub, f"{where}.{key}" if where else str(key))
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for i, sub in enumerate(value):
            found = find_class_spec(sub, f"{where}[{i}]")
            if found is not None:
                return found
    elif hasattr(value, "as_dict") and type(value).__name__ == "Namespace":
        return find_class_spec(value.as_dict(), where)
    return None


def _plain_data_only(val: Any, serialize: bool, instantiate_classes: bool, sub_add_kwargs: Any) -> Any:
    """Replaces jsonargparse's `adapt_classes_any`: a value typed `Any` is returned as data, never instantiated."""
    found = find_class_spec(val)
    if found is not None:
        at = "" if found == "(the value itself)" else f" (at {found})"
        raise PlainDataError(
            f"a class_path{at} in a value that holds plain data (numbers, strings, booleans, lists, dicts): "
            "such values are never instantiated. Remove the class_path; for a backend's options, "
            "`lightning_cqk attention` lists what each one takes."
        )
    return val


def refuse_class_specs(hparams: Any, source: str) -> None:
    """Refuse settings read from a file (a checkpoint's hyper-parameters) that name a class anywhere."""
    found = find_class_spec(hparams)
    if found is not None:
        raise PlainDataError(
            f"{source} names a class in its saved settings ({found} holds a class_path). A checkpoint's settings are "
            "plain data (this package never saves a class there), so the file was edited or made elsewhere and is "
            "refused before anything is parsed or built. Resume from a checkpoint that lightning_cqk fit wrote."
        )


_installed = False


def install() -> None:
    """Make every jsonargparse parser of this process follow the two rules above (idempotent)."""
    global _installed
    if _installed:
        return
    from jsonargparse import _typehints

    original_import = _typehints.import_object

    def guarded_import(name: Any) -> Any:
        check_class_path(name)
        return original_import(name)

    _typehints.import_object = guarded_import
    _typehints.adapt_classes_any = _plain_data_only
    _installed = True
