"""Package layout beyond what pyproject.toml can say: the top-level `configs/` and `callbacks/` ship in the wheel.

The repository keeps its YAML where a user of a checkout looks for it (`configs/`, `callbacks/`); the wheel installs
them as the package data `lightning_cqk/shipped/configs` and `lightning_cqk/shipped/callbacks`, which
`lightning_cqk.files.resources` finds when a path is not in the working directory. Everything else is in pyproject.toml.
"""

from pathlib import Path

from setuptools import find_packages, setup

SHIPPED = {"lightning_cqk.shipped.configs": "configs", "lightning_cqk.shipped.callbacks": "callbacks"}
HERE = Path(__file__).parent

# Every folder of YAML is a data package of its own (setuptools treats folders as packages).
data_packages = {
    ".".join([name, *folder.relative_to(HERE / root).parts]): folder.relative_to(HERE).as_posix()
    for name, root in SHIPPED.items()
    for folder in [HERE / root, *sorted(p for p in (HERE / root).rglob("*") if p.is_dir())]
    if any(folder.glob("*.yaml")) or folder == HERE / root
}

setup(
    packages=[*find_packages(include=["lightning_cqk", "lightning_cqk.*"]), *data_packages],
    package_dir=data_packages,
    package_data={name: ["*.yaml"] for name in data_packages},
)
