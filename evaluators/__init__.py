"""evaluators: the cascade policy -> compile -> correctness -> timing -> profile.

Import the stages from their packages (``evaluators.compile``, ``evaluators.policy``,
``evaluators.pipeline``, ...). This ``__init__`` imports nothing, so the isolated child
(``python -m evaluators.child.harness``) loads only what it uses, not the compile stage or the
policy.
"""
