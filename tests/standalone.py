"""Prelude for a fresh interpreter that must not import the engine: it proves that exported
files (op.py, test_op.py) stand alone. Prepend :data:`ENGINE_IMPORT_BLOCKER` to the code run
with ``python -c``."""

from __future__ import annotations

import textwrap

ENGINE_IMPORT_BLOCKER = textwrap.dedent("""
    import sys
    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name.split('.')[0] in ('evo', 'evaluators', 'mutators', 'populations'):
                raise ImportError('blocked engine import: ' + name)
            return None
    sys.meta_path.insert(0, _Block())
""")
