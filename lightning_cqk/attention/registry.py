"""Where attention backends and q/k transforms come from: built-ins, installed plugins, and `package.module:Class`.

A name in `model.config.attention` (or a `qk_transform: {kind: ...}`) is resolved, in every process alike (fit, the
sweep's workers, generate, eval, glue, `attention`, `check-backend`), by `Registry.resolve`:

1. **Built-ins** register by their class attribute: every `AttentionBackend` subclass defined in a module of
   `lightning_cqk.attention` that sets `name` in its own class body (for q/k transforms: every `QKTransform` subclass
   that sets `kind`) is found by walking the package and its folders (backends/, transforms/, kernels/) with
   `pkgutil`. Adding a built-in is its file (plus one `Case` in `tests/backend_cases.py`, which the contract harness
   asks for); there is no list to keep in step.
2. **Plugins** of installed distributions: a distribution declares ``name = "package.module:Class"`` in the
   entry-point group `lightning_cqk.attention` (q/k transforms: `lightning_cqk.qk_transform`), found with
   `importlib.metadata`; the entry point is loaded only when its name is asked for. Two distributions claiming one
   name, or a plugin claiming a built-in's name, are refused naming both.
3. **A path** ``package.module:Class`` typed in a config file or on the command line: the module is imported and the
   class must subclass the base class.

**Safety.** A checkpoint records the backend as the user gave it (its registered name or its `module:Class` path).
Settings read from a checkpoint are data: under `recorded_by(source)` (the checkpoint loaders) a path's module is
imported only when it is already imported, provided by an installed entry point, or its top-level package is trusted
(`LIGHTNING_CQK_TRUSTED_MODULES`, the variable `cli/class_paths.py` reads for callbacks); never because the checkpoint
names it. A backend that is not installed ends in one paragraph naming it and how to install or trust it. A path
written before the built-ins moved into their folders (`lightning_cqk.attention.standard:StandardAttention`) still
names the same class: `MOVED_MODULES` maps each old module to its folder, so a recorded path stays valid data.

Every failure (a module that does not import, a class that is not a subclass, an entry point that fails to load, a
clash) is a `ConfigError`: one paragraph, no traceback.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import functools
import importlib
import importlib.metadata
import pkgutil
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lightning_cqk.environment import env_modules
from lightning_cqk.errors import ConfigError

ATTENTION_GROUP = "lightning_cqk.attention"
TRANSFORM_GROUP = "lightning_cqk.qk_transform"
#: The same variable `cli/class_paths.py` reads (comma-separated top-level packages the user trusts).
TRUSTED_ENV = "LIGHTNING_CQK_TRUSTED_MODULES"
PACKAGE = "lightning_cqk.attention"
#: Built-in modules as they were named before the catalogue's folders (issue 46), as a config or checkpoint may have
#: recorded them in a `module:Class` path -> where the same module lives now.
MOVED_MODULES = {
    **{f"{PACKAGE}.{m}": f"{PACKAGE}.backends.{m}" for m in ("standard", "differential", "mla")},
    **{f"{PACKAGE}.{m}": f"{PACKAGE}.backends.{m}" for m in ("deconstructed_mixing", "deconstructed_qk")},
    **{f"{PACKAGE}.{m}": f"{PACKAGE}.transforms.{m}" for m in ("coupled", "coupled_flow", "coupling", "dynamics")},
    **{f"{PACKAGE}.{m}": f"{PACKAGE}.kernels.{m}" for m in ("functional", "matched_norm")},
}
_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

#: Set by `recorded_by` while settings read from a file (a checkpoint) are resolved: the file's description.
_recorded_source: contextvars.ContextVar[str | None] = contextvars.ContextVar("recorded_source", default=None)


@contextlib.contextmanager
def recorded_by(source: str) -> Iterator[None]:
    """Resolve names read from `source` (e.g. "the checkpoint runs/x/last.ckpt") as data: no path's module is
    imported because of them unless it is installed as a plugin or trusted (module docstring)."""
    token = _recorded_source.set(source)
    try:
        yield
    finally:
        _recorded_source.reset(token)


def is_path(name: Any) -> bool:
    """True for a `package.module:Class` path (rather than a registered name)."""
    return isinstance(name, str) and ":" in name


def trusted_roots() -> tuple[str, ...]:
    """Top-level packages whose modules a recorded path may import: this one and `$LIGHTNING_CQK_TRUSTED_MODULES`."""
    return ("lightning_cqk", *env_modules(TRUSTED_ENV))


def first_line(err: BaseException) -> str:
    """`Type: first line of the message` of an exception (what a one-paragraph error quotes)."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


@dataclass(frozen=True)
class Plugin:
    """One entry point of the group: its name, its `module:Class` value and the distribution that declares it."""

    name: str
    value: str
    distribution: str
    entry_point: importlib.metadata.EntryPoint


@functools.lru_cache(maxsize=16)
def _entry_points(group: str, path_key: tuple[str, ...]) -> dict[str, tuple[Plugin, ...]]:
    found: dict[str, dict[tuple[str, str], Plugin]] = {}
    for ep in importlib.metadata.entry_points(group=group):
        dist = getattr(getattr(ep, "dist", None), "name", None) or "an unnamed distribution"
        found.setdefault(ep.name, {})[(ep.value, dist)] = Plugin(ep.name, ep.value, dist, ep)
    return {name: tuple(by_value.values()) for name, by_value in found.items()}


class Registry:
    """Names -> classes of one kind (attention backends or q/k transforms); see the module docstring."""

    def __init__(self, group: str, base_path: str, key: str, noun: str, plural: str, option: str) -> None:
        self.group = group
        self._base_path = base_path  # "module:Class" of the base class (imported lazily: no import cycle)
        self.key = key  # the class attribute holding a built-in's name
        self.noun = noun  # "attention backend" / "q/k transform"
        self.plural = plural  # how the list of names is introduced
        self.option = option  # where a user names one, for messages
        self._builtins: dict[str, type] | None = None

    @property
    def base(self) -> type:
        module, _, cls = self._base_path.partition(":")
        return getattr(importlib.import_module(module), cls)

    # ------------------------------------------------------------------------------------------------ built-ins
    @property
    def builtins(self) -> dict[str, type]:
        """name -> class of every built-in, found by walking `lightning_cqk.attention` (module docstring, item 1).

        The dict is built once; tests may register a class in it for their duration (`monkeypatch.setitem`).
        """
        if self._builtins is None:
            package = importlib.import_module(PACKAGE)
            base = self.base
            found: dict[str, type] = {}
            for info in pkgutil.walk_packages(package.__path__, prefix=f"{PACKAGE}."):
                module = importlib.import_module(info.name)
                for obj in vars(module).values():
                    if not (isinstance(obj, type) and issubclass(obj, base) and obj.__module__ == module.__name__):
                        continue
                    name = obj.__dict__.get(self.key)
                    if not isinstance(name, str) or not name:
                        continue
                    if name in found and found[name] is not obj:
                        raise ConfigError(
                            f"Two built-in {self.noun}s are named {name!r}: {_label(found[name])} and {_label(obj)}. "
                            f"Rename one ({self.key} = ...)."
                        )
                    found[name] = obj
            self._builtins = found
        return self._builtins

    # ------------------------------------------------------------------------------------------------ plugins
    def plugins(self) -> dict[str, tuple[Plugin, ...]]:
        """name -> the entry points of installed distributions declaring it (usually one), none loaded."""
        return _entry_points(self.group, tuple(sys.path))

    def names(self, plugins: bool = True) -> list[str]:
        """Sorted registered names: the built-ins and (with `plugins`) the installed plugins'."""
        return sorted({*self.builtins, *(self.plugins() if plugins else ())})

    # ------------------------------------------------------------------------------------------------ lookup
    def resolve(self, name: str) -> type:
        """The class a name or `module:Class` path stands for, or a one-paragraph ConfigError."""
        if is_path(name):
            return self._resolve_path(name)
        claims = self.plugins().get(name, ()) if isinstance(name, str) else ()
        if name in self.builtins:
            if claims:
                raise ConfigError(
                    f"The {self.noun} name {name!r} is a built-in of lightning_cqk, and the installed distribution "
                    f"{_names(claims)} declares it too (entry point group {self.group!r}): a plugin may not shadow a "
                    "built-in, so both are refused rather than one chosen silently. Rename the plugin's entry point "
                    f"(in its pyproject.toml) or uninstall it (pip uninstall {claims[0].distribution})."
                )
            return self.builtins[name]
        if len(claims) > 1:
            raise ConfigError(
                f"Two installed distributions declare the {self.noun} {name!r} (entry point group {self.group!r}): "
                f"{_names(claims)}. Neither is chosen silently: uninstall one, rename one's entry point, or name the "
                f"class itself as package.module:Class ({' or '.join(repr(p.value) for p in claims)})."
            )
        if claims:
            return self._load_plugin(claims[0])
        raise ConfigError(self._unknown(name))

    def _unknown(self, name: Any) -> str:
        source = _recorded_source.get()
        how = (
            f"A plugin is found when an installed distribution declares it in the entry-point group {self.group!r} "
            f"(pip install its package), or named as package.module:Class."
        )
        if source is not None:
            return (
                f"{source} was made with the {self.noun} {name!r}, which is not installed here: it is no built-in and "
                f"no installed distribution declares it (entry-point group {self.group!r}). Install the package that "
                "provides it (pip install <that package>), then run this again."
            )
        close = difflib.get_close_matches(str(name), self.names(), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return f"Unknown {self.noun} {name!r}.{hint} Available {self.plural}: {', '.join(self.names())}. {how}"

    def _load_plugin(self, plugin: Plugin) -> type:
        try:
            cls = plugin.entry_point.load()
        except Exception as err:  # noqa: BLE001 - a plugin's import may raise anything; said in one paragraph
            raise ConfigError(
                f"The {self.noun} {plugin.name!r} (entry point {plugin.value!r} of the installed distribution "
                f"{plugin.distribution!r}) failed to load: {first_line(err)}. Fix or reinstall that distribution "
                f"(pip install --force-reinstall {plugin.distribution}); its own error is above in --debug."
            ) from err
        self._check_class(cls, f"{plugin.name!r} (entry point {plugin.value!r} of {plugin.distribution!r})")
        declared = cls.__dict__.get(self.key)
        if declared and declared != plugin.name:
            raise ConfigError(
                f"The {self.noun} entry point {plugin.name!r} of the distribution {plugin.distribution!r} loads "
                f"{_label(cls)}, whose {self.key} is {declared!r}: the two must agree (the name a checkpoint records "
                f"is the entry point's). Set {self.key} = {plugin.name!r} in the class or rename the entry point."
            )
        return cls

    def _resolve_path(self, path: str) -> type:
        if not _PATH.match(path):
            raise ConfigError(
                f"{self.option} {path!r} is not a package.module:Class path (dotted module, one colon, class name), "
                f"e.g. mylab.sigattn:SigmoidAttention."
            )
        module_name, _, qualname = path.partition(":")
        module_name = MOVED_MODULES.get(module_name, module_name)
        source = _recorded_source.get()
        if source is not None and not self._may_import(module_name):
            root = module_name.split(".", 1)[0]
            raise ConfigError(
                f"{source} was made with the {self.noun} {path!r}, and settings read from a file are data: its module "
                f"{module_name!r} is not imported because a file names it. It is imported when its package is "
                f"installed as a plugin (an entry point in group {self.group!r}) or when you trust it: if {root!r} is "
                f"your own code, export {TRUSTED_ENV}={root} and run this again."
            )
        try:
            module = importlib.import_module(module_name)
        except Exception as err:  # noqa: BLE001 - the user's module may raise anything; said in one paragraph
            raise ConfigError(
                f"{self.option} {path!r}: importing {module_name!r} failed: {first_line(err)}. Make the module "
                "importable (its package installed, or its folder on PYTHONPATH) and check the path's spelling."
            ) from None
        obj: Any = module
        for part in qualname.split("."):
            if not hasattr(obj, part):
                raise ConfigError(
                    f"{self.option} {path!r}: module {module_name!r} has no {part!r}. Public names there: "
                    f"{', '.join(n for n in sorted(vars(module)) if not n.startswith('_')) or 'none'}."
                )
            obj = getattr(obj, part)
        self._check_class(obj, repr(path))
        return obj

    def _may_import(self, module_name: str) -> bool:
        if module_name in sys.modules or module_name.split(".", 1)[0] in trusted_roots():
            return True
        return any(p.value.split(":", 1)[0].strip() == module_name for ps in self.plugins().values() for p in ps)

    def _check_class(self, obj: Any, what: str) -> None:
        base = self.base
        if not (isinstance(obj, type) and issubclass(obj, base)):
            kind = type(obj).__name__ if not isinstance(obj, type) else f"a class not derived from {base.__name__}"
            raise ConfigError(
                f"The {self.noun} {what} is {kind}, not a subclass of {base.__module__}.{base.__name__}: a plugin "
                f"subclasses it exactly as the built-ins do (docs/your-attention.md)."
            )


def _label(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _names(plugins: tuple[Plugin, ...]) -> str:
    return " and ".join(f"{p.distribution!r} ({p.name} = {p.value!r})" for p in plugins)


ATTENTION = Registry(
    ATTENTION_GROUP, "lightning_cqk.attention.base:AttentionBackend", "name", "attention backend", "backends",
    "model.config.attention",
)  # fmt: skip
TRANSFORMS = Registry(
    TRANSFORM_GROUP,
    "lightning_cqk.attention.transform:QKTransform",
    "kind",
    "q/k transform",
    "kinds",
    "qk_transform kind",
)


def config_names(config: Any) -> list[tuple[Registry, str]]:
    """Every backend and q/k transform name a model config (a dict or a jsonargparse Namespace) holds: `attention`,
    each `layer_overrides[i].attention`, and the `qk_transform` kinds of their options."""
    if hasattr(config, "as_dict"):
        config = config.as_dict()
    if not isinstance(config, dict):
        return []
    found: list[tuple[Registry, str]] = []
    layers = [config, *[o for o in config.get("layer_overrides") or [] if isinstance(o, dict)]]
    for layer in layers:
        if isinstance(layer.get("attention"), str):
            found.append((ATTENTION, layer["attention"]))
        transform = (layer.get("attention_options") or {}).get("qk_transform")
        if isinstance(transform, dict) and isinstance(transform.get("kind"), str):
            found.append((TRANSFORMS, transform["kind"]))
    return found


def check_recorded(config: Any, source: str, typed: Any = ()) -> None:
    """Resolve every name a config read from `source` (a checkpoint) holds as data (`recorded_by`), except the names
    the user typed this time (`typed`, a config of the same shape): a one-paragraph ConfigError for a backend that is
    not installed, or a path whose module is neither an installed plugin's nor trusted."""
    mine = {name for _, name in config_names(typed)}
    with recorded_by(source):
        for registry, name in config_names(config):
            if name not in mine:
                registry.resolve(name)


def label(cls: type, registry: Registry = ATTENTION) -> str:
    """The name a class is known by: its registered name, else its `module:Class` path."""
    return cls.__dict__.get(registry.key) or _label(cls)
