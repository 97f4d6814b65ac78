"""Attention backends and q/k transforms from outside the package (issue 42 items 1-3, `attention/registry.py`).

Each test "installs" distributions the way pip leaves them (a `<name>-<version>.dist-info` folder with METADATA and
entry_points.txt beside the modules, on sys.path), so importlib.metadata finds their entry points, and removes them
afterwards. The example plugin of `examples/sigmoid_attention` is found through its entry point and through its
`module:Class` path; clashes, broken plugins and bad paths fail in one paragraph; names read from a checkpoint never
import an untrusted module; a built-in registers by its file alone.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from lightning_cqk import attention
from lightning_cqk.attention import registry
from lightning_cqk.attention.registry import ATTENTION, check_recorded
from lightning_cqk.errors import ConfigError
from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig

EXAMPLE_SRC = Path(__file__).resolve().parents[3] / "examples" / "sigmoid_attention" / "src"
SIGMOID = "cqk_sigmoid.attention:SigmoidAttention"
TINY = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11)

#: A minimal plugin backend (causal: a running mean of a projection), written into test modules.
MEAN_BACKEND = """
import torch
from torch import nn
from lightning_cqk.attention import AttentionBackend


class MeanAttention(AttentionBackend):
    name = {name!r}

    def __init__(self, config, layer_idx, options):
        super().__init__(config, layer_idx, options)
        self.out_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x, ctx):
        steps = torch.arange(1, x.size(1) + 1, dtype=x.dtype, device=x.device)[:, None]  # (T, 1)
        return self.out_proj(x.cumsum(1) / steps)  # (B, T, C)
"""


#: The FLOPs a run needs (token budgets, throughput), appended to MEAN_BACKEND's class body.
FLOPS = """
    @classmethod
    def forward_flops_per_token(cls, config, options, seq_len):
        return 2 * config.n_embd * config.n_embd
"""


def install(
    site: Path, dist: str, entry_points: dict[str, dict[str, str]], modules: dict[str, str] | None = None
) -> None:
    """Write a distribution `dist` into `site` as pip would: its modules and a dist-info with its entry points."""
    info = site / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    lines = []
    for group, names in entry_points.items():
        lines += [f"[{group}]", *(f"{name} = {value}" for name, value in names.items()), ""]
    (info / "entry_points.txt").write_text("\n".join(lines))
    for module, text in (modules or {}).items():
        path = site / (module.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


@pytest.fixture
def site(tmp_path, monkeypatch):
    """An empty site folder on sys.path; the modules imported from it are forgotten afterwards."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    before = set(sys.modules)
    yield folder
    for name in set(sys.modules) - before:
        if name.split(".")[0] in {p.name.removesuffix(".py") for p in folder.iterdir()}:
            del sys.modules[name]


@pytest.fixture
def example(site):
    """The example plugin installed as pip would (its modules from examples/, a dist-info with its entry point)."""
    install(site, "cqk-sigmoid", {registry.ATTENTION_GROUP: {"sigmoid": SIGMOID}})
    sys.path.insert(0, str(EXAMPLE_SRC))
    yield site
    sys.path.remove(str(EXAMPLE_SRC))
    for name in [m for m in sys.modules if m.split(".")[0] == "cqk_sigmoid"]:
        del sys.modules[name]


def test_the_example_plugin_is_found_through_its_entry_point(example):
    assert "sigmoid" in attention.available() and "sigmoid" not in attention.available(plugins=False)
    cls = attention.get_attention("sigmoid")
    assert cls.__module__ == "cqk_sigmoid.attention" and issubclass(cls, attention.AttentionBackend)
    model = GPT(ModelConfig(**TINY, attention="sigmoid", attention_options={"bias": -1.0}))
    assert type(model.blocks[0].attn) is cls and model.blocks[0].attn.bias == -1.0


def test_the_example_plugin_is_found_through_its_module_class_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE_SRC))
    for name in ("cqk_sigmoid", "cqk_sigmoid.attention"):
        monkeypatch.delitem(sys.modules, name, raising=False)  # imported here, forgotten afterwards
    config = ModelConfig(**TINY, attention=SIGMOID)
    assert type(GPT(config).blocks[1].attn).__name__ == "SigmoidAttention"
    assert "sigmoid" not in attention.available()  # not installed: only the path names it


def test_two_distributions_claiming_one_name_are_refused_naming_both(site):
    backend = MEAN_BACKEND.format(name="mean")
    install(site, "lab-one", {registry.ATTENTION_GROUP: {"mean": "lab_one:MeanAttention"}}, {"lab_one": backend})
    install(site, "lab-two", {registry.ATTENTION_GROUP: {"mean": "lab_two:MeanAttention"}}, {"lab_two": backend})
    with pytest.raises(ConfigError, match="Two installed distributions") as err:
        attention.get_attention("mean")
    assert "'lab-one'" in str(err.value) and "'lab-two'" in str(err.value)
    assert type(GPT(ModelConfig(**TINY, attention="lab_one:MeanAttention")).blocks[0].attn).__name__ == "MeanAttention"


def test_a_plugin_shadowing_a_built_in_is_refused_naming_it(site):
    install(site, "sneaky", {registry.ATTENTION_GROUP: {"standard": "sneaky:MeanAttention"}})
    with pytest.raises(ConfigError, match="built-in of lightning_cqk, and the installed distribution 'sneaky'"):
        ModelConfig(**TINY)


def test_an_entry_point_that_fails_to_load_names_its_distribution(site):
    install(site, "broken-lab", {registry.ATTENTION_GROUP: {"broken": "broken_lab:X"}}, {"broken_lab": "import nope\n"})
    with pytest.raises(ConfigError) as err:
        attention.get_attention("broken")
    message = str(err.value)
    assert "'broken-lab'" in message and "failed to load: ModuleNotFoundError: No module named 'nope'" in message
    assert "\n" not in message


def test_paths_that_do_not_import_or_are_no_backend_fail_in_one_paragraph(site):
    install(
        site, "odd", {}, {"odd_mod": "raise RuntimeError('boom\\nsecond line')\n", "plain": "class Thing:\n    pass\n"}
    )
    with pytest.raises(ConfigError, match=r"importing 'odd_mod' failed: RuntimeError: boom\. ") as err:
        ModelConfig(**TINY, attention="odd_mod:Cls")
    assert "second line" not in str(err.value)
    with pytest.raises(ConfigError, match="not a subclass of lightning_cqk.attention.base.AttentionBackend"):
        attention.get_attention("plain:Thing")
    with pytest.raises(ConfigError, match="module 'plain' has no 'Missing'. Public names there: Thing"):
        attention.get_attention("plain:Missing")
    with pytest.raises(ConfigError, match="is not a package.module:Class path"):
        attention.get_attention("plain:Thing:x")


def test_options_a_plugin_rejects_are_named(example):
    with pytest.raises(ConfigError, match="Unknown option 'bais' for attention backend 'sigmoid'. Did you mean 'bias'"):
        ModelConfig(**TINY, attention="sigmoid", attention_options={"bais": 1.0})


def test_a_q_k_transform_plugin_is_found_through_its_entry_point(site):
    transform = """
    from lightning_cqk.attention.transform import QKTransform


    class Swap(QKTransform):
        kind = "swap"

        def forward(self, q, k, keys_kept=False):
            return k, q

        @classmethod
        def flops_per_token(cls, options, n_pairs, dim):
            return 0
    """
    install(site, "lab-swap", {registry.TRANSFORM_GROUP: {"swap": "lab_swap:Swap"}}, {"lab_swap": transform})
    config = ModelConfig(**TINY, attention_options={"qk_transform": {"kind": "swap"}})
    assert type(GPT(config).blocks[0].attn.qk_transform).__name__ == "Swap"
    with pytest.raises(ValueError, match="Unknown q/k transform 'swp'. Did you mean 'swap'"):
        ModelConfig(**TINY, attention_options={"qk_transform": {"kind": "swp"}})


def test_a_checkpoint_never_imports_a_module_because_it_names_it(site, monkeypatch):
    marker = site / "imported"
    install(site, "mylab", {}, {"mylab": f"open({str(marker)!r}, 'w').close()\n" + MEAN_BACKEND.format(name="")})
    saved = {**TINY, "attention": "mylab:MeanAttention"}
    with pytest.raises(ConfigError) as err:
        check_recorded(saved, "The checkpoint run/last.ckpt")
    message = str(err.value)
    assert message.startswith("The checkpoint run/last.ckpt was made with the attention backend 'mylab:MeanAttention'")
    assert "export LIGHTNING_CQK_TRUSTED_MODULES=mylab" in message and not marker.exists()
    check_recorded(saved, "The checkpoint run/last.ckpt", typed={"attention": "mylab:MeanAttention"})  # typed again
    assert not marker.exists()
    ModelConfig(**saved)  # what the user types is imported
    assert marker.exists()


def test_a_trusted_module_named_by_a_checkpoint_is_imported(site, monkeypatch):
    install(site, "mylab2", {}, {"mylab2": MEAN_BACKEND.format(name="")})
    monkeypatch.setenv(registry.TRUSTED_ENV, "other,mylab2")
    check_recorded({**TINY, "attention": "mylab2:MeanAttention"}, "The checkpoint x.ckpt")
    assert "mylab2" in sys.modules


def test_a_checkpoint_of_a_plugin_that_is_not_installed_is_refused_by_name(example):
    check_recorded({**TINY, "attention": "sigmoid"}, "The checkpoint x.ckpt")  # installed: resolves
    sys.path.remove(str(EXAMPLE_SRC))
    try:
        with pytest.raises(ConfigError) as err:
            check_recorded({**TINY, "layer_overrides": [{"attention": "sigmoid2", "layers": [1]}]}, "The checkpoint x")
    finally:
        sys.path.insert(0, str(EXAMPLE_SRC))
    assert str(err.value).startswith(
        "The checkpoint x was made with the attention backend 'sigmoid2', which is not installed here"
    )


def test_a_new_built_in_registers_by_its_file_alone(tmp_path, monkeypatch):
    """A module dropped into the attention package's folder (here: a second folder of the package's __path__) with an
    `AttentionBackend` subclass that sets `name` is a built-in: listed, buildable, no other edit."""
    (tmp_path / "mean_backend.py").write_text(MEAN_BACKEND.format(name="running_mean"))
    monkeypatch.setattr(attention, "__path__", [*attention.__path__, str(tmp_path)])
    monkeypatch.setattr(ATTENTION, "_builtins", None)
    monkeypatch.delitem(sys.modules, "lightning_cqk.attention.mean_backend", raising=False)
    try:
        assert "running_mean" in attention.available(plugins=False)
        assert type(GPT(ModelConfig(**TINY, attention="running_mean")).blocks[0].attn).__name__ == "MeanAttention"
    finally:
        sys.modules.pop("lightning_cqk.attention.mean_backend", None)


def test_generate_recomputes_for_a_backend_without_a_cache(site):
    from lightning_cqk.inference.generate import can_cache, generate, generate_reference

    install(site, "meanlab", {}, {"meanlab": MEAN_BACKEND.format(name="")})
    model = GPT(ModelConfig(**TINY, attention="meanlab:MeanAttention")).eval()
    assert not can_cache(model) and can_cache(GPT(ModelConfig(**TINY)))
    steps = list(generate(model, [[1, 2, 3]], 4))  # no NotImplementedError from new_cache: the window is recomputed
    assert [s.tokens for s in steps] == [s.tokens for s in generate_reference(model, [[1, 2, 3]], 4)]


def test_validate_from_a_checkpoint_never_imports_the_path_it_names(site, tiny_shards, tmp_path, monkeypatch):
    """The command-line side of the rule: `validate --ckpt_path` of a run trained with `resumelab:MeanAttention` (typed
    then, so imported) is refused before the module is imported again, unless the path is typed again."""
    from tiny_run import tiny_args, tiny_fit

    from lightning_cqk.cli.main import main

    marker = site / "imported"
    module = f"open({str(marker)!r}, 'a').close()\n" + MEAN_BACKEND.format(name="") + FLOPS
    install(site, "resumelab", {}, {"resumelab": module})
    runs = tmp_path / "runs"
    main(tiny_fit(tiny_shards, runs, "--model.config.attention=resumelab:MeanAttention", "--trainer.max_steps=2"))
    (ckpt,) = runs.glob("*/*/checkpoints/last.ckpt")
    assert ckpt.parts[-3].startswith("resumelab.MeanAttention-tiny")  # no colon in a run directory's name
    marker.unlink()
    monkeypatch.delitem(sys.modules, "resumelab")  # a new process: nothing imported yet
    with pytest.raises(SystemExit) as done:
        main(["validate", *tiny_args(tiny_shards, runs, f"--ckpt_path={ckpt}")])
    message = str(done.value.code)
    assert message.startswith(f"lightning_cqk validate: The checkpoint {ckpt} was made with the attention backend")
    assert "export LIGHTNING_CQK_TRUSTED_MODULES=resumelab" in message and not marker.exists()
    typed = "--model.config.attention=resumelab:MeanAttention"  # the user names it again: imported (trust: above)
    main(["validate", *tiny_args(tiny_shards, runs, typed, f"--ckpt_path={ckpt}")])
    assert marker.exists()


def test_the_attention_command_lists_a_plugin_that_does_not_load_with_why(site, capsys):
    from lightning_cqk.contract.backends_table import attention_command

    install(site, "broken-lab2", {registry.ATTENTION_GROUP: {"broken2": "broken_lab2:X"}}, {"broken_lab2": "1 / 0\n"})
    attention_command([])
    out = capsys.readouterr().out
    assert "broken2" in out and "(not usable)" in out and "ZeroDivisionError" in out and "standard " in out


def test_a_plugin_without_declared_flops_cannot_train_and_says_why(site):
    from lightning_cqk.model.flops import training_flops_per_batch

    install(site, "noflops", {}, {"noflops": MEAN_BACKEND.format(name="")})
    config = ModelConfig(**TINY, attention="noflops:MeanAttention")
    with pytest.raises(ConfigError, match="'noflops:MeanAttention' does not define forward_flops_per_token, which"):
        training_flops_per_batch(config, 1, 8)
