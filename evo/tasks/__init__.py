"""The task suite: what a kernel must compute, on which inputs, how exactly, how fast.

Public API (everything a caller needs; see docs/tasks.md)::

    get_task(name) -> Task                    # built-ins; UnknownTaskError (a KeyError) lists names
    task_names(family=None) -> list[str]      # built-ins
    families() -> list[str]                   # ["kernelbench-l1", "modern"]
    tasks_for(["kb19_relu", "family:modern"]) -> list[Task]
    task_table(gpu) -> list[dict]             # rows for `evo tasks`
    BUILTIN_TASKS: TaskRegistry               # the module functions above read it
    BUILTIN_TASKS.with_files(paths) -> TaskRegistry   # plus user tasks; TaskFileError (a ValueError)
    registry.get / names / families / select / table / with_tasks / files
    load_task_file(path) -> list[Task]        # a user file's tasks, validated, registered nowhere
    gpu_names(), get_gpu(name), detect_gpu(), speed_of_light_ms(task, shape, gpu)
    evo.tasks.tolerance.check(out, ref, tol) -> (ok, reason, metrics)
    tolerances for task authors: FP32_ELEMENTWISE, FP32_SOFTMAX, BF16_ELEMENTWISE, BF16_GEMM,
    strict_fp32_reduction(k) (= fp32_gemm(k)), ArgExtremum(dim) for index outputs with ties

Importing this package needs neither torch nor a GPU: the task modules name torch through
:mod:`evo.tasks.lazy_torch`, imported when a reference runs or an input is drawn.
"""

from evo.tasks.base import Shape, Task, Tolerance
from evo.tasks.gpus import GpuSpec, UnknownGpuError, detect_gpu, get_gpu, gpu_names, speed_of_light_ms
from evo.tasks.inputs import DISTRIBUTIONS, InputSpec, TensorInputs
from evo.tasks.registry import (
    BUILTIN_TASKS,
    DuplicateTaskError,
    InvalidTaskError,
    UnknownFamilyError,
    UnknownTaskError,
    families,
    format_shape,
    TaskRegistry,
    get_task,
    task_names,
    task_table,
    tasks_for,
    validate_task,
)
from evo.tasks.tolerance import ArgExtremum, check_exact, fp32_gemm, strict_fp32_reduction
from evo.tasks.tolerance import BF16_ELEMENTWISE, BF16_GEMM, FP32_ELEMENTWISE, FP32_SOFTMAX
from evo.tasks.user import TaskFileError, load_task_file, seed_path

__all__ = [
    "Shape",
    "Task",
    "Tolerance",
    "GpuSpec",
    "UnknownGpuError",
    "detect_gpu",
    "get_gpu",
    "gpu_names",
    "speed_of_light_ms",
    "DISTRIBUTIONS",
    "InputSpec",
    "TensorInputs",
    "BUILTIN_TASKS",
    "TaskRegistry",
    "DuplicateTaskError",
    "InvalidTaskError",
    "UnknownFamilyError",
    "UnknownTaskError",
    "families",
    "format_shape",
    "get_task",
    "task_names",
    "task_table",
    "tasks_for",
    "validate_task",
    "TaskFileError",
    "load_task_file",
    "seed_path",
    "ArgExtremum",
    "check_exact",
    "fp32_gemm",
    "strict_fp32_reduction",
    "FP32_ELEMENTWISE",
    "FP32_SOFTMAX",
    "BF16_ELEMENTWISE",
    "BF16_GEMM",
]
