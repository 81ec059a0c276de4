"""`python -m harness` is the `servelab` command."""

from harness.cli import main

main()
