"""The package layout: one import namespace, `servelab`, over the repository's layer folders.

Each folder the design names (`harness/`, `strategies/`, ...) installs as `servelab.<folder>`,
so the wheel holds the single top-level package `servelab` (its `__main__` in `src/servelab/`;
why it is laid out so: that file's docstring). pyproject.toml holds everything else. The
folders' sub-packages are found here rather than listed, so that a new one cannot be left out
of the wheel.
"""

from setuptools import find_namespace_packages, setup

LAYERS = (
    "base", "kernels", "workloads", "engine", "models", "strategies", "harness", "reports",
    "commands", "conf",
)  # fmt: skip
NOT_INSTALLED = ("reports.published", "reports.published.*")  # results, not code

packages = ["servelab"]
for layer in LAYERS:
    found = find_namespace_packages(include=[f"{layer}.*"], exclude=NOT_INSTALLED)
    packages += [f"servelab.{name}" for name in (layer, *found) if "__pycache__" not in name]

setup(
    packages=packages,
    package_dir={"servelab": "src/servelab", **{f"servelab.{layer}": layer for layer in LAYERS}},
    package_data={"": ["*.yaml", "*.cpp", "*.h"]},
)
