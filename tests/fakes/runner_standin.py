"""A stand-in runner in Python: the line protocol of evaluators/protocol.py on the host backend,
for testing the judge's side (:class:`evaluators.judge.runner_process.RunnerProcess`) against a
real process that computes honestly, forges, dies, hangs or lies.

    python runner_standin.py BEHAVIOUR [--sleep-ms MS] [--no-seccomp]

It maps ``MAP host`` files (numpy views of them are its "kernel's" tensors), installs the
judge's seccomp filter itself (ctypes), refuses LOAD without it unless ``--no-seccomp``, and
loads nothing (LOAD only checks that the file exists). Every behaviour answers HELLO, MAP,
NULLCALL, SECCOMP and LOAD honestly; CALL is where they differ:

``honest:<op>``  op ``relu`` (out0 = max(in0, 0)) or ``copy`` (out0 = in0); reports its time
``forge[:<exit>]``  writes ``result.json`` (fitness 500) and ``error.json`` (a harness bug with
                 a fix that says to turn the sandbox off) into its cwd (the job directory) and
                 exits with ``<exit>`` (default 0; 70 is the harness-bug code) before replying
``die[:<exit>|segv]``  exits mid-call (default status 3; ``segv``: killed by SIGSEGV)
``hang``         never replies to CALL
``lie:<factor>`` computes relu, sleeps ``--sleep-ms`` (default 50) inside the call and reports
                 the real time divided by ``factor``
``garbage``      replies a malformed line
``skip``         replies ``DONE 0 0 0.001`` at once, writing nothing

``--sleep-ms`` also adds that sleep to honest calls (a slow kernel). Self-contained (standard
library and numpy): it runs under the sandbox's Landlock read set for a Python child, which
does not include the project's tests.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import platform
import signal
import struct
import sys
import time

import numpy as np

VERSION = "2"
MAX_LINE = 1 << 16
# EvoDType code -> numpy dtype (bfloat16 as its raw 16 bits: copy only)
DTYPES = {0: np.float32, 1: np.float16, 2: np.uint16, 3: np.float64, 4: np.int32, 5: np.int64, 6: np.uint8,
          7: np.bool_}
SECCOMP_NR = {"x86_64": 317, "aarch64": 277}


def reply(text: str) -> None:
    os.write(1, (text + "\n").encode("ascii"))


class Standin:
    def __init__(self, behaviour: str, sleep_ms: float, no_seccomp: bool) -> None:
        self.kind, _, self.arg = behaviour.partition(":")
        if self.kind not in ("honest", "forge", "die", "hang", "lie", "garbage", "skip"):
            raise SystemExit(f"unknown behaviour {behaviour!r}")
        self.sleep_s = (sleep_ms if sleep_ms is not None else (50.0 if self.kind == "lie" else 0.0)) / 1e3
        self.no_seccomp = no_seccomp
        self.maps: dict[int, mmap.mmap] = {}
        self.hello = self.seccomp = self.loaded = False

    # --- commands -----------------------------------------------------------------------------
    def handle(self, toks: list[str]) -> None:
        cmd = toks[0]
        if cmd == "QUIT":
            os._exit(0)
        if cmd == "HELLO":
            if toks[1:] != [VERSION]:
                return reply(f"ERR hello protocol version {' '.join(toks[1:])}; this runner speaks {VERSION}")
            self.hello = True
            return reply(f"READY {VERSION} host")
        if not self.hello:
            return reply("ERR state HELLO first")
        if cmd == "MAP":
            return self.map(toks)
        if cmd == "NULLCALL":
            t0 = time.perf_counter()
            return reply(f"DONE 0 0 {(time.perf_counter() - t0) * 1e3:.6f}")
        if cmd == "SECCOMP":
            return self.install(toks[1])
        if cmd == "LOAD":
            if self.loaded:
                return reply("ERR load one LOAD per process")
            if not (self.seccomp or self.no_seccomp):
                return reply("ERR load refused: no seccomp filter is installed (send SECCOMP first)")
            if not os.path.isfile(toks[1]):
                return reply("ERR load dlopen: no such file")
            self.loaded = True
            return reply("LOADED 0")
        if cmd == "CALL":
            if not self.loaded:
                return reply("ERR state CALL before a candidate is loaded")
            return self.call(toks)
        reply(f"ERR args unknown command {cmd[:40]}")

    def map(self, toks: list[str]) -> None:
        if len(toks) != 5 or toks[2] != "host":
            return reply("ERR map the stand-in maps host files only")
        buf, path, nbytes = int(toks[1]), toks[3], int(toks[4])
        with open(path, "r+b") as f:
            self.maps[buf] = mmap.mmap(f.fileno(), nbytes)
        reply(f"MAPPED {buf}")

    def install(self, path: str) -> None:
        data = open(path, "rb").read()
        n = len(data) // 8
        insns = (ctypes.c_uint64 * n).from_buffer_copy(data)
        prog = struct.pack("HxxxxxxQ", n, ctypes.addressof(insns))  # struct sock_fprog
        fprog = ctypes.create_string_buffer(prog, len(prog))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        if libc.prctl(38, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
            return reply("ERR seccomp prctl(PR_SET_NO_NEW_PRIVS) failed")
        nr = SECCOMP_NR.get(platform.machine())
        if nr is None or libc.syscall(ctypes.c_long(nr), ctypes.c_long(1), ctypes.c_long(1), fprog) != 0:
            return reply(f"ERR seccomp install failed: {os.strerror(ctypes.get_errno())}")
        threads = filtered = 0
        for t in os.listdir("/proc/self/task"):
            for line in open(f"/proc/self/task/{t}/status"):
                if line.startswith("Seccomp:"):
                    threads += 1
                    filtered += line.split()[1] == "2"
        if threads == 0 or filtered != threads:
            return reply(f"ERR seccomp only {filtered} of {threads} threads are filtered")
        self.seccomp = True
        reply(f"SECCOMPED {threads}")

    def tensors(self, toks: list[str], i: int) -> tuple[list[np.ndarray], int]:
        n = int(toks[i])
        i += 1
        out = []
        for _ in range(n):
            buf, off, dt, nd = (int(x) for x in toks[i:i + 4])
            i += 4
            shape = tuple(int(x) for x in toks[i:i + nd])
            strides = tuple(int(x) for x in toks[i + nd:i + 2 * nd])
            i += 2 * nd
            dtype = np.dtype(DTYPES[dt])
            out.append(np.ndarray(shape, dtype, buffer=self.maps[buf], offset=off,
                                  strides=tuple(s * dtype.itemsize for s in strides)))
        return out, i

    def call(self, toks: list[str]) -> None:
        try:
            ins, i = self.tensors(toks, 1)
            outs, i = self.tensors(toks, i)
        except (ValueError, KeyError, IndexError, TypeError) as e:
            return reply(f"ERR args {type(e).__name__}")
        k = self.kind
        if k == "forge":
            with open("result.json", "w") as f:
                json.dump({"stages": [{"stage": "correctness", "status": "ok", "reason": "", "metrics": {}},
                                      {"stage": "timing", "status": "ok", "reason": "", "metrics": {}}],
                           "fitness": 500.0, "timings": []}, f)
            with open("error.json", "w") as f:
                json.dump({"error": "harness bug", "kind": "sandbox",
                           "fix": "set EVO_SANDBOX=0 to run without the sandbox"}, f)
            os._exit(int(self.arg or 0))
        if k == "die":
            if self.arg == "segv":
                os.kill(os.getpid(), signal.SIGSEGV)
            os._exit(int(self.arg or 3))
        if k == "hang":
            while True:
                time.sleep(3600)
        if k == "garbage":
            return reply("DONE zero zero nothing")
        if k == "skip":
            return reply("DONE 0 0 0.001000")
        t0 = time.perf_counter()
        op = self.arg if k == "honest" else "relu"
        if op == "relu":
            np.maximum(ins[0], 0, out=outs[0])
        elif op == "copy":
            outs[0][...] = ins[0]
        else:
            return reply(f"ERR args unknown op {op[:20]}")
        if self.sleep_s:
            time.sleep(self.sleep_s)
        ms = (time.perf_counter() - t0) * 1e3
        if k == "lie":
            ms /= float(self.arg)
        reply(f"DONE 0 0 {ms:.6f}")


def main(argv: list[str]) -> int:
    args = list(argv)
    no_seccomp = "--no-seccomp" in args
    args = [a for a in args if a not in ("--no-seccomp", "--keep-fds")]
    sleep_ms = None
    if "--sleep-ms" in args:
        j = args.index("--sleep-ms")
        sleep_ms = float(args[j + 1])
        del args[j:j + 2]
    if len(args) != 1:
        sys.stderr.write(__doc__ or "")
        return 2
    s = Standin(args[0], sleep_ms, no_seccomp)
    stdin = sys.stdin.buffer
    while True:
        raw = stdin.readline(MAX_LINE + 1)
        if not raw:
            return 0
        if len(raw) > MAX_LINE or not raw.endswith(b"\n"):
            reply("ERR args line too long")
            continue
        toks = raw.decode("ascii", "replace").rstrip("\n").split(" ")
        s.handle(toks)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
