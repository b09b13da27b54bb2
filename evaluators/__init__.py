"""evaluators: the cascade policy -> compile -> correctness -> timing -> profile.

Import the stages from their packages (``evaluators.compile``, ``evaluators.policy``,
``evaluators.pipeline``, ...). The trusted side that decides every verdict is
``evaluators.judge``; the untrusted side, the only process that loads a candidate, is
``evaluators.runner``; what passes between them is ``evaluators.protocol``; the kernel ABI both
build on is ``evaluators.abi``. This ``__init__`` imports nothing.
"""
