"""What runs inside the isolated child process, one candidate per process.

``python -m evaluators.child.harness JOBDIR`` (started by :mod:`evaluators.isolation`) and
``python -m evaluators.child.profile JOBDIR`` (started under ncu by :mod:`evaluators.profile`)
are the two programs; the rest is what they use:

==================  =========================================================================
``protocol.py``     the job directory's protocol, shared with the parent: modes, the harness
                    bug exit code, stage results as JSON, the version stored with every time
``harness.py``      the GPU harness: job.json in, result.json out (correctness, then timing)
``correctness.py``  adversarial inputs against the torch reference
``timing.py``       CUDA-event timing against the torch reference
``device_state.py`` GPU state a candidate leaves behind, reset before timing
``abi.py``          the ctypes loader of a built ``.so``: Python's one statement of
                    ``evo_abi.h`` (beside it: the header every kernel includes, on nvcc's
                    include path through :func:`evaluators.compile.abi_include_dir`)
``profile.py``      the program ncu profiles: one call of the candidate inside an NVTX range
==================  =========================================================================

Nothing here imports the store, the engine or the parent's process handling; this package's
``__init__`` imports nothing, so ``python -m evaluators.child.harness`` loads only what the
child uses.
"""
