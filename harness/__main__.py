"""`python -m harness` is the `servelab` command."""

from harness.commands.cli import main

main()
