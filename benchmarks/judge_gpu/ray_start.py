"""How long a local Ray instance takes to start on this machine, alone and beside torch's import.

``evo search`` begins a local instance's start on a thread at the command's entry while the
main thread loads the config (which imports torch); on a fresh H100 machine the instance was
ready only at 13.1 s, the same as when its start began after the import. This probe says
why, each case in a fresh process (one JSON line each, seconds from the process's start):

  alone         import ray; ray.init (as evo.engine.local_ray starts it); one task's round trip
  beside_torch  the same on a thread while the main thread imports torch (evo search's case)
  subprocess    ``ray start --head --block`` in a child process while the main thread imports
                torch, then ray.init(address="auto") joining it (none of the start's Python
                in the measuring process)

usage: python benchmarks/judge_gpu/ray_start.py [CASE ...]     (default: all three, in order)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

CASES = ("alone", "beside_torch", "subprocess")


def _task_round_trip(t0: float, marks: dict) -> None:
    import ray

    @ray.remote(num_cpus=1)
    def one() -> int:
        return os.getpid()

    ray.get(one.remote())
    marks["first_task"] = round(time.monotonic() - t0, 3)


def _init_and_task(t0: float, marks: dict) -> None:
    import ray

    marks["ray_imported"] = round(time.monotonic() - t0, 3)
    ray.init(include_dashboard=False, log_to_driver=False)
    marks["ray_init"] = round(time.monotonic() - t0, 3)
    _task_round_trip(t0, marks)


def case_alone() -> dict:
    t0, marks = time.monotonic(), {}
    _init_and_task(t0, marks)
    return marks


def case_beside_torch() -> dict:
    t0, marks = time.monotonic(), {}
    th = threading.Thread(target=_init_and_task, args=(t0, marks))
    th.start()
    import torch  # noqa: F401

    marks["torch_imported"] = round(time.monotonic() - t0, 3)
    th.join()
    return marks


def _ray_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ray.scripts.scripts", *args]


def case_subprocess() -> dict:
    t0, marks = time.monotonic(), {}
    child = subprocess.Popen(_ray_cli("start", "--head", "--block", "--port=6390", "--include-dashboard=false",
                                      "--disable-usage-stats"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    import torch  # noqa: F401

    marks["torch_imported"] = round(time.monotonic() - t0, 3)
    import ray

    marks["ray_imported"] = round(time.monotonic() - t0, 3)
    for _ in range(1200):   # "auto": the address the head writes once it is up
        try:
            ray.init(address="auto", log_to_driver=False)
            break
        except ConnectionError:
            time.sleep(0.05)
    marks["ray_init"] = round(time.monotonic() - t0, 3)
    _task_round_trip(t0, marks)
    child.terminate()
    return marks


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[1].startswith("--case="):
        case = argv[1].split("=", 1)[1]
        marks = globals()[f"case_{case}"]()
        print(json.dumps({"case": case, **marks}), flush=True)
        os._exit(0)   # no shutdown wait in the measured process
    for case in argv[1:] or CASES:
        if case not in CASES:
            print(f"unknown case {case!r}; one of {', '.join(CASES)}", file=sys.stderr)
            return 2
        t = time.monotonic()
        try:
            r = subprocess.run([sys.executable, __file__, f"--case={case}"], capture_output=True, text=True,
                               timeout=120)
            line = (r.stdout.strip().splitlines() or [f'{{"case": "{case}", "rc": {r.returncode}}}'])[-1]
            print(line, f"(process {time.monotonic() - t:.1f} s)", flush=True)
            if r.returncode:
                print(r.stderr[-800:], file=sys.stderr)
        except subprocess.TimeoutExpired:
            print(f'{{"case": "{case}", "timed_out_s": 120}}', flush=True)
        subprocess.run(_ray_cli("stop", "--force"), capture_output=True, timeout=90)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
