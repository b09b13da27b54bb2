"""Print the build fingerprint of every built-in seed: the compile cache key (sha256 over the
source, its parameters, nvcc's flags, the ABI header's bytes and the tool versions; see
``evaluators.compile.cache_key``) and the nvcc argv with the machine's paths abstracted.

Why: a refactor that moves code must not change what nvcc builds. Two trees whose seeds have
the same fingerprints hand nvcc the same inputs, so they build the same SASS. Run it before
and after, and diff::

    python benchmarks/build_fingerprint.py > before.json   # on the old tree
    python benchmarks/build_fingerprint.py > after.json    # on the new tree
    diff before.json after.json && echo "same builds"

Needs nvcc (it is asked its version) and the nvidia-cutlass wheel; no GPU.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    from evaluators.base import CompileSettings
    from evaluators import compile as C
    from evo.tasks.seeds import SEEDS, seed_params, seed_source
    from evo.core.records import canonical_params

    settings = CompileSettings()
    nvcc = C.find_nvcc(settings)
    nvcc_ver, cutlass_ver = C.nvcc_version(nvcc), C.cutlass_version()
    out = {}
    for name in sorted(SEEDS):
        src, params = seed_source(name), seed_params(name)
        pairs = canonical_params(params)
        argv = C.build_command("NVCC", "SRC.cu", "OUT.so", settings, pairs)
        argv = [a.replace(str(C.abi_include_dir()), "ABI_DIR").replace(str(C.cutlass_include_dir()), "CUTLASS_DIR")
                for a in argv]
        out[name] = {"key": C.cache_key(src, pairs, settings, nvcc_ver, cutlass_ver), "argv": argv}
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
