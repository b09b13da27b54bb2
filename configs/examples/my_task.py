"""A worked user task: row-wise L2 normalisation, fp32 (docs/tasks.md, "Adding your own task").

Point a config at this file and include the task:

    [tasks]
    files = ["configs/examples/my_task.py"]
    include = ["rownorm_l2"]

or try it alone:  evo tasks --task-file configs/examples/my_task.py --family user
                  evo check configs/examples/my_task_seed.cu --task rownorm_l2 \
                      --task-file configs/examples/my_task.py

Rules a task file follows (the loader checks them and names the fix when one is broken):
* it defines ``TASKS = [Task(...), ...]`` (or a function ``tasks()`` returning that list);
* ``reference``, ``make_inputs``, ``flops`` and ``bytes`` are module-level functions (or
  picklable objects such as ``TensorInputs``), because the task travels to the isolated GPU
  process by pickling; lambdas and nested functions are rejected;
* ``make_inputs(shape, generator, dist, device)`` returns the reference's arguments, created on
  ``device`` with ``generator`` (which lives on that device), deterministic for a seed;
* ``seed`` names the starting kernel: a ``.cu`` path relative to this file (below), or the name
  of a built-in seed whose kernel computes the same function with the same inputs.
"""

import torch

from evo.tasks import InputSpec, Task, TensorInputs, Tolerance

EPS = 1e-12


def rownorm_l2(x: torch.Tensor) -> torch.Tensor:
    """y = x / max(||x||_2, eps) over the last dim (torch.nn.functional.normalize)."""
    return torch.nn.functional.normalize(x, p=2.0, dim=-1, eps=EPS)


def rownorm_flops(shape) -> float:
    # square, accumulate, scale: about 3 flops per element
    return 3.0 * shape["R"] * shape["C"]


def rownorm_bytes(shape) -> float:
    # compulsory traffic: read x once, write y once, 4 bytes per fp32 element
    return 2.0 * 4 * shape["R"] * shape["C"]


TASKS = [
    Task(
        name="rownorm_l2",
        family="user",  # forced to "user" by the loader anyway
        dtype="float32",
        description="Row-wise L2 normalisation: y[R,C] = x / max(||x[r,:]||_2, eps), eps = "
        "scalars[0] = 1e-12, fp32 row-major, fp32-accurate.",
        reference=rownorm_l2,
        # One input x[R, C] in the task dtype; the generator gives every distribution below.
        make_inputs=TensorInputs((InputSpec(("R", "C")),), "float32"),
        # The first shape is benchmarked; the odd small ones catch hard-coded sizes and
        # missing tail handling (a long row too).
        shapes=({"R": 16384, "C": 4096}, {"R": 129, "C": 1031}, {"R": 3, "C": 65537}),
        # atol is in units of the reference's RMS (atol_relative=True): strict fp32.
        tolerance=Tolerance(atol=1e-6, rtol=1e-5, rel_l2=1e-5, atol_relative=True),
        flops=rownorm_flops,
        bytes=rownorm_bytes,
        scalars=(EPS,),
        distributions=("normal", "wide", "uniform", "kernelbench"),
        reference_dtype="float64",
        seed="my_task_seed.cu",  # relative to this file
        tags=("reduction", "norm"),
    ),
]
