"""``python -m evo.cli ...``: the same as the ``evo`` console script."""

from evo.cli.commands import main

main()
