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
- **A class path must be in the allow-list**, checked by name *before* its module is imported, so a module outside
  it never runs. The allow-list names this package (`TRUSTED_MODULES`: its own code, every class of it) and, of the
  libraries (`LIBRARY_MODULES`: Lightning, torch, torchmetrics, jsonargparse), only the classes a config may
  instantiate (`TRUSTED_CLASSES`: the callbacks, loggers, profilers and strategies the docs name), not whole modules:
  a library class path is imported (library code, already trusted at import) and refused unless it is one of those
  classes, before anything is built. A researcher's own callbacks or data modules are added by naming their package
  (or a module or class) in the environment variable `LIGHTNING_CQK_TRUSTED_MODULES` (comma-separated, e.g.
  `LIGHTNING_CQK_TRUSTED_MODULES=mylab`; read by `environment.env_modules`).
- Where the classes may write is `run/outputs.py`'s: inside their own run directory (checked on the settings, before
  anything is built).

A checkpoint's hyper-parameters are data too: `refuse_class_specs` checks them (`cli/trainer.py`,
`_merge_checkpoint_hparams`) before they are compared with the command line's and merged under it, and a checkpoint
that names a class anywhere in them is refused by name before anything is parsed, imported or built.
Tests: `tests/e2e/reliability/test_untrusted_checkpoints.py` (issue 34, defect 1).
"""

from __future__ import annotations

from typing import Any

from lightning_cqk.environment import env_modules

#: This package's own code: any class of it may be named.
TRUSTED_MODULES = ("lightning_cqk",)
#: Libraries whose modules may be imported by name, but of whose classes only `TRUSTED_CLASSES` may be instantiated.
LIBRARY_MODULES = ("lightning", "pytorch_lightning", "lightning_fabric", "torch", "torchmetrics", "jsonargparse")
#: The library classes a config, flag or checkpoint may name (their public import paths; Lightning's checkpoint
#: callbacks are named here so that `run_outputs` can refuse them with the package's equivalent).
TRUSTED_CLASSES = (
    *(f"lightning.pytorch.callbacks.{name}" for name in (
        "LearningRateMonitor", "EarlyStopping", "ModelSummary", "RichModelSummary", "TQDMProgressBar",
        "RichProgressBar", "DeviceStatsMonitor", "Timer", "GradientAccumulationScheduler", "StochasticWeightAveraging",
        "ThroughputMonitor", "ModelCheckpoint", "OnExceptionCheckpoint")),
    "lightning.pytorch.loggers.TensorBoardLogger",
    "lightning.pytorch.loggers.CSVLogger",
    *(f"lightning.pytorch.profilers.{name}" for name in (
        "SimpleProfiler", "AdvancedProfiler", "PyTorchProfiler", "PassThroughProfiler")),
    *(f"lightning.pytorch.strategies.{name}" for name in (
        "DDPStrategy", "FSDPStrategy", "ModelParallelStrategy", "SingleDeviceStrategy")),
    *(f"lightning.pytorch.accelerators.{name}" for name in ("CPUAccelerator", "CUDAAccelerator")),
    *(f"lightning.fabric.plugins.environments.{name}" for name in (
        "LightningEnvironment", "SLURMEnvironment", "TorchElasticEnvironment")),
)  # fmt: skip
TRUSTED_ENV = "LIGHTNING_CQK_TRUSTED_MODULES"


class PlainDataError(ValueError):
    """A `class_path` inside a value that must be plain data (a key typed `Any`)."""


class UntrustedClassError(ValueError):
    """A `class_path` outside the allow-list (module docstring)."""


def trusted_modules() -> tuple[str, ...]:
    """The packages any class of which may be named: this package's, plus `$LIGHTNING_CQK_TRUSTED_MODULES`."""
    return (*TRUSTED_MODULES, *env_modules(TRUSTED_ENV))


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def check_class_path(name: Any) -> None:
    """Refuse an import path outside this package, the user's trusted modules and the libraries (before anything
    is imported)."""
    if not isinstance(name, str):
        return
    if _under(name, trusted_modules()) or name.split(".", 1)[0] in LIBRARY_MODULES:
        return
    root = name.split(".", 1)[0]
    raise UntrustedClassError(
        f"class_path {name!r} is not in the allow-list of what a config, flag or checkpoint may name (this package, "
        f"the library classes `lightning_cqk.cli.class_paths.TRUSTED_CLASSES` lists, and {TRUSTED_ENV}): importing "
        f"it would run its code. If it is your own, trusted code, add its package: export {TRUSTED_ENV}={root}"
    )


_trusted_objects: set[int] | None = None


def _trusted_class_ids() -> set[int]:
    """The `TRUSTED_CLASSES`, imported once (library modules), as object ids (a class has several import paths)."""
    global _trusted_objects
    if _trusted_objects is None:
        from jsonargparse._util import import_object

        found = set()
        for path in TRUSTED_CLASSES:
            try:
                found.add(id(import_object(path)))
            except (ImportError, AttributeError):  # a class this Lightning release does not have
                continue
        _trusted_objects = found
    return _trusted_objects


def check_imported_class(name: Any, obj: Any) -> None:
    """Refuse a library class (imported by `name`) that `TRUSTED_CLASSES` does not list, before it is built.
    Functions and other objects a typed key may name are left to jsonargparse's type checks."""
    if not isinstance(name, str) or not isinstance(obj, type) or _under(name, trusted_modules()):
        return
    if name.split(".", 1)[0] not in LIBRARY_MODULES or id(obj) in _trusted_class_ids():
        return
    listed = ", ".join(p.rsplit(".", 1)[-1] for p in TRUSTED_CLASSES)
    raise UntrustedClassError(
        f"class_path {name!r} is a library class that a config, flag or checkpoint may not instantiate here: of the "
        f"libraries, only these classes may be named ({listed}; `lightning_cqk.cli.class_paths.TRUSTED_CLASSES`). "
        f"If you trust it, name it: export {TRUSTED_ENV}={name}"
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
        obj = original_import(name)
        check_imported_class(name, obj)
        return obj

    _typehints.import_object = guarded_import
    _typehints.adapt_classes_any = _plain_data_only
    _installed = True
