"""An in-process runner for the judge's CPU tests: the same members as
:class:`evaluators.judge.runner_process.RunnerProcess`, speaking the protocol of
:mod:`evaluators.protocol` line for line (its replies go through ``parse_reply``), on host
buffers it maps from the ``MAP host`` files exactly as a runner would.

Its "kernel" is a Python function over torch views of those buffers, and a fake clock stands
for time: every call advances it by the call's real cost, and the runner reports what its
behaviour says (the truth, a lie, nothing). Behaviours, each a way a compromised runner could
act: ``honest``; ``lie`` (reports ``cost / lie_factor``); ``skip_from`` (from that call on,
answers without running the kernel); ``hang_at`` / ``die_at`` / ``garbage_at`` (that call
hangs, the process dies, it answers outside the protocol); ``forge_at`` (writes a result
file and an error file into the job directory claiming success, then dies as if it exited 0);
``refuse_map`` (cannot map memory: our failure, before any candidate code).
"""

from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from evaluators import protocol
from evaluators.judge.runner_process import RunnerGone, RunnerTimeout

_CODES = {v: k for k, v in protocol.DTYPE_CODES.items()}


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def relu_kernel(ins: list[torch.Tensor], outs: list[torch.Tensor], scalars: list[float]) -> int:
    outs[0].copy_(torch.relu(ins[0]))
    return 0


@dataclass
class FakeRunner:
    kernel: Callable[[list, list, list], int]
    clock: FakeClock
    jobdir: Path
    cost_ms: float = 1.0
    overhead_ms: float = 0.1
    lie_factor: float = 1.0
    skip_from: int | None = None
    hang_at: int | None = None
    die_at: int | None = None
    garbage_at: int | None = None
    forge_at: int | None = None
    refuse_map: bool = False
    layers: tuple[str, ...] = ("in-process fake",)
    backend: str = "host"
    pid: int = 0
    calls: int = 0
    log: list[str] = field(default_factory=list)
    closed: bool = False
    _maps: dict[int, Any] = field(default_factory=dict)
    _loaded: bool = False
    _dead: bool = False

    # --- RunnerProcess's members -----------------------------------------------------------
    def request(self, line: str, timeout_s: float) -> tuple[Any, float]:
        if self._dead:
            raise RunnerGone("the runner exited (status 0)")
        self.log.append(line.split(" ", 1)[0])
        t0 = self.clock()
        raw = self._answer(line, timeout_s)
        return protocol.parse_reply(raw.encode()), self.clock() - t0

    def install_seccomp(self, timeout_s: float = 10) -> int:
        self.log.append("SECCOMP")
        return 1

    def close(self) -> int | None:
        self.closed = True
        return 0

    def kill(self) -> None:
        self.closed = True

    def stderr_tail(self, n: int = 2000) -> str:
        return ""

    # --- the protocol --------------------------------------------------------------------
    def _answer(self, line: str, timeout_s: float) -> str:
        toks = line.split(" ")
        cmd = toks[0]
        self.clock.advance(self.overhead_ms / 1e3)
        if cmd == "MAP":
            if self.refuse_map:
                return "ERR map cannot map this buffer"
            buf, kind, path, nbytes = int(toks[1]), toks[2], toks[3], int(toks[4])
            assert kind == "host", kind
            fd = os.open(path, os.O_RDWR)
            try:
                mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
            self._maps[buf] = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes)
            return f"MAPPED {buf}"
        if cmd == "NULLCALL":
            return "DONE 0 0 0.001"
        if cmd == "LOAD":
            self._loaded = True
            return "LOADED 0"
        if cmd == "CALL":
            assert self._loaded, "CALL before LOAD"
            return self._call(toks, timeout_s)
        return "ERR args unknown command"

    def _tensors(self, toks: list[str], i: int) -> tuple[list[torch.Tensor], int]:
        n = int(toks[i])
        i += 1
        out = []
        for _ in range(n):
            buf, off, code, nd = (int(t) for t in toks[i:i + 4])
            i += 4
            shape = tuple(int(t) for t in toks[i:i + nd])
            strides = tuple(int(t) for t in toks[i + nd:i + 2 * nd])
            i += 2 * nd
            dtype = getattr(torch, _CODES[code])
            item = torch.empty((), dtype=dtype).element_size()
            flat = self._maps[buf][off:].view(torch.uint8)
            usable = (flat.numel() // item) * item
            out.append(flat[:usable].view(dtype).as_strided(shape, strides))
        return out, i

    def _call(self, toks: list[str], timeout_s: float) -> str:
        k = self.calls
        self.calls += 1
        if self.hang_at is not None and k >= self.hang_at:
            self.clock.advance(timeout_s)
            self._dead = True
            raise RunnerTimeout(f"no reply within {timeout_s} s; the runner was killed")
        if self.die_at is not None and k >= self.die_at:
            self._dead = True
            raise RunnerGone("the runner was killed by signal 11 (SIGSEGV)")
        if self.forge_at is not None and k >= self.forge_at:
            (self.jobdir / "result.json").write_text(json.dumps(
                {"stages": [{"stage": "correctness", "status": "ok"}, {"stage": "timing", "status": "ok"}],
                 "fitness": 500.0}))
            (self.jobdir / "error.json").write_text(json.dumps({"kind": "sandbox", "error": "forged"}))
            self._dead = True
            raise RunnerGone("the runner exited (status 0) before answering")
        if self.garbage_at is not None and k >= self.garbage_at:
            return "DONE 0 0 fast"
        ins, i = self._tensors(toks, 1)
        outs, i = self._tensors(toks, i)
        scalars = [float(t) for t in toks[i + 1:]]
        if self.skip_from is not None and k >= self.skip_from:
            return "DONE 0 0 0.001"
        rc = self.kernel(ins, outs, scalars)
        self.clock.advance(self.cost_ms / 1e3)
        return f"DONE {rc} 0 {self.cost_ms / self.lie_factor!r}"
