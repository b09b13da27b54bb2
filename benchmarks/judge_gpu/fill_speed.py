"""The timed calls' input draw on the GPU: the task's own draw (torch's generator) against the
Triton draw (evaluators/judge/fill.py), milliseconds per draw into the benchmark shape's input
buffers, median of 20 after 3 warm-up draws, CUDA events; and the draw the judge chooses there
(evaluators.judge.fill.faster, as input_filler measures it).

usage: python3 benchmarks/judge_gpu/fill_speed.py [TASK ...]   (default: kb19_relu gelu_bf16)
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from evaluators.judge import fill  # noqa: E402
from evaluators.judge.trials import draw_into  # noqa: E402
from evo.tasks import get_task  # noqa: E402


def _ms(fn, n: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main(argv: list[str]) -> int:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| task | shape | inputs | task's draw ms | Triton draw ms | same bits twice | the judge's choice |")
    print("|---|---|---|---|---|---|---|")
    for name in argv or ["kb19_relu", "gelu_bf16"]:
        task = get_task(name)
        shape = dict(task.shapes[0])
        dtype = getattr(torch, task.make_inputs.dtype)
        bufs = [torch.empty(s, dtype=dtype, device="cuda") for s in task.make_inputs.sizes(shape)]
        dist = task.distributions[0] if task.distributions else "normal"
        own = _ms(lambda: draw_into(task, bufs, shape, 7, dist))
        ok = fill.self_check_once("cuda", dtype, dist)
        fast = _ms(lambda: fill.fast_fill(bufs, 7, dist)) if ok else float("nan")
        again = [torch.empty_like(b) for b in bufs]
        fill.fast_fill(again, 7, dist)
        same = ok and all(torch.equal(x, y) for x, y in zip(bufs, again))
        gb = sum(b.numel() * b.element_size() for b in bufs) / 1e9
        choice = fill.faster({"triton": lambda: fill.fast_fill(bufs, 7, dist),
                              "task": lambda: draw_into(task, bufs, shape, 7, dist)}, fill._device_ms) if ok else "task"
        print(f"| {name} | {shape} | {gb:.2f} GB {dtype} {dist} | {own:.2f} | {fast:.2f} | {same} | {choice} |")
        del bufs, again
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
