"""After a run: reading, judging and shipping what a search recorded.

``status`` (where a run stands), ``lineage`` (a kernel's ancestry and details), ``report``
(the static HTML report), ``views`` (the terminal renderings of those), ``export`` (champions
as standalone PyTorch ops) and ``bench`` (re-measuring champions or seeds). Each reads the
lineage store (the CLI opens it read-only, ``Store.open_reader``; ``bench`` and ``export``
also compile and run kernels); none writes a run's records. The ``evo`` commands over them
are in :mod:`evo.cli.inspect` and :mod:`evo.cli.kernels`.
"""
