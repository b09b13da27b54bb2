"""Prompt inputs for LLM-mutator tests: a small task description and a kernel source whose
size the test chooses (``n`` device functions), so prompts can be made to fit a window or not."""

from __future__ import annotations

from mutators.llm.prompt.context import TaskInfo


def task_info() -> TaskInfo:
    return TaskInfo(reference_src="def add(a, b):\n    return a + b\n", abi_text="evo_launch(...)",
                    shapes_text="N=1024", dtype="float32", tolerance_text="1e-5", description="Add two vectors.")


def kernel_source(n: int, k: float = 1.0) -> str:
    return "// kernel\n" + "".join(f"__device__ float f{i}(float x) {{ return x * {i * k}f + 1.0f; }}\n"
                                    for i in range(n)) + "extern \"C\" int evo_launch() { return 0; }\n"
