"""benchmarks/lab/precompile.py: compiles probe specs and repeat.py variants into the compile cache.

Contract: ``main([items...])`` compiles every variant of every ``.json`` probe spec and every
``TASK:NAME=V,...`` argument (rendered from ``--source``) with the evaluator's compile stage
into ``<repo>/.evo/cache``, prints one ``ok``/``FAIL`` line per variant and returns 0, or 1 when
any build fails (printing the reason). Real nvcc (no GPU needed); skipped without nvcc.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from toolchain import toolchain  # noqa: E402


@pytest.mark.slow
def test_spec_and_variant_compile_then_a_bad_variant_fails(tmp_path, capsys):
    toolchain()                                   # skips without nvcc / the CUTLASS wheel
    from benchmarks.lab.precompile import main

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([{"label": "relu", "task": "kb19_relu", "source": "seed", "params": {}}]))
    assert main([str(spec), "kb19_relu:ITEMS=2", "--source", "seed"]) == 0
    out = capsys.readouterr().out
    assert out.count("ok   kb19_relu") == 2, out
    # a tunable value that is not a number/identifier is rejected by the compile stage
    assert main(["kb19_relu:ITEMS=2;rm", "--source", "seed"]) == 1
    assert "FAIL kb19_relu" in capsys.readouterr().out
