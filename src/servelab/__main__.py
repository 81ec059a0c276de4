"""`python -m servelab` is the `servelab` command.

Every module of the project imports under the one name `servelab`, so that no generic
top-level name (Hugging Face's `kernels`, a user's own `reports`) can shadow the project or be
shadowed by it. Each layer folder of the repository installs as `servelab.<folder>` (setup.py):
`harness`, `strategies`, `kernels`, `workloads`, `reports`, and `conf`, the Hydra config tree.
Nothing at the repository root is a package: this file lives under `src/`, out of reach of a
Python started there, and the layer folders hold no `__init__.py`, so there Python finds them
only as namespace portions, which an installed package of the same name always wins over.
`servelab` itself is a namespace package too: setuptools' editable install maps namespace
folders only below a namespace parent.
"""

from servelab.commands.cli import main

main()
