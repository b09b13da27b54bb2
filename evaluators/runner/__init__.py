"""The untrusted side of evaluation: the runner, the one process that loads a candidate.

This package holds ONLY what belongs to that side: the runner's C++ source
(``evo_runner.cpp``, package data; it includes ``evaluators/abi/evo_abi.h``) and the code
that builds it (:mod:`evaluators.runner.build`). Nothing here is imported by a runner, and
nothing here reads what a runner says: the judge (:mod:`evaluators.judge`, trusted) drives
runners through :mod:`evaluators.judge.runner_process` and the line protocol of
:mod:`evaluators.protocol`, and computes every verdict itself from memory it owns.

The runner maps the judge's buffers (CUDA IPC, or host files on the ``host`` backend that CI
uses), installs the seccomp filter the judge hands it, loads the candidate, calls
``evo_launch`` when told, and reports return codes and an event time. It computes no verdict.
"""

from evaluators.runner.build import BACKENDS, RUNNER_SOURCE, RunnerBuildError, build_command, runner_binary

__all__ = ["BACKENDS", "RUNNER_SOURCE", "RunnerBuildError", "build_command", "runner_binary"]
