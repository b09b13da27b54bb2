"""A user task with an integer output: row-wise argmax of an fp32 matrix (KernelBench 51-style).

    [tasks]
    files = ["my_task.py", "my_argmax_task.py"]   # relative to the config file
    include = ["rownorm_l2", "rowargmax"]

Integer and boolean outputs are compared exactly (ties resolved as torch resolves them: the
first index of an equal maximum). A task that accepts *any* index of an equal value says so
with ``index_rule=ArgExtremum(dim=1)``. This file also shows that a task file may import a
module next to it (``_example_counts``).
"""

import torch

from _example_counts import rowwise_bytes
from evo.tasks import InputSpec, Task, TensorInputs, Tolerance


def rowargmax(x: torch.Tensor) -> torch.Tensor:
    """idx[r] = argmax over the last dim (int64)."""
    return torch.argmax(x, dim=1)


def rowargmax_flops(shape) -> float:
    return 1.0 * shape["R"] * shape["C"]  # one compare per element


def rowargmax_bytes(shape) -> float:
    return rowwise_bytes(shape, in_bytes=4, out_bytes_per_row=8)


TASKS = [
    Task(
        name="rowargmax",
        family="user",
        dtype="float32",
        description="Row-wise argmax: idx[R] = argmax_c x[R, C], fp32 in, int64 out, exact "
        "(ties to the first index, NaN wins, as torch.argmax).",
        reference=rowargmax,
        make_inputs=TensorInputs((InputSpec(("R", "C")),), "float32"),
        shapes=({"R": 16384, "C": 4096}, {"R": 129, "C": 1031}, {"R": 3, "C": 65537}),
        # Unused for an integer output (compared exactly), but a Task always has one.
        tolerance=Tolerance(atol=0.0, rtol=0.0, rel_l2=1e-12),
        flops=rowargmax_flops,
        bytes=rowargmax_bytes,
        distributions=("normal", "wide", "uniform"),
        seed="my_argmax_seed.cu",
        tags=("reduction", "index"),
    ),
]
