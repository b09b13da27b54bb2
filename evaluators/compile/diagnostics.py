"""What a compile log says: ptxas's per-kernel resources and advisories (:func:`parse_ptxas`),
the errors worth showing a repair prompt (:func:`extract_errors`), and logs trimmed and
made stable (:func:`trim_log`, :func:`_sanitize`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Any

from evaluators.compile.toolchain import CutlassNotFound, cutlass_include_dir


ERRORS_MAX_LINES = 40
ERRORS_MAX_BYTES = 4 * 1024
LOG_MAX_BYTES = 16 * 1024


@dataclass(frozen=True)
class KernelResources:
    """ptxas resource usage of one entry function (kernel)."""

    name: str
    registers: int = 0
    barriers: int = 0
    smem_bytes: int = 0
    cmem_bytes: int = 0
    stack_frame: int = 0
    spill_stores: int = 0
    spill_loads: int = 0

    def as_dict(self) -> dict[str, int]:
        d = dataclasses.asdict(self)
        d.pop("name")
        return d


@dataclass(frozen=True)
class PtxasReport:
    """What ``-Xptxas -v`` said: per-kernel resources and performance advisories.

    ``wgmma_serialized``: ``(function, cause)`` for every "wgmma.mma_async instructions are
    serialized due to <cause>" advisory, a strong signal that a Hopper GEMM lost its tensor
    core pipelining. ``advisories``: every ``(Cxxxx)`` advisory line, verbatim.
    """

    kernels: tuple[KernelResources, ...] = ()
    wgmma_serialized: tuple[tuple[str, str], ...] = ()
    advisories: tuple[str, ...] = ()

    def metrics(self) -> dict[str, Any]:
        ks = self.kernels
        return {
            "kernels": {k.name: k.as_dict() for k in ks},
            "registers": max((k.registers for k in ks), default=0),
            "smem_bytes": max((k.smem_bytes for k in ks), default=0),
            "stack_frame": max((k.stack_frame for k in ks), default=0),
            "spill_stores": sum(k.spill_stores for k in ks),
            "spill_loads": sum(k.spill_loads for k in ks),
            "wgmma_serialized": bool(self.wgmma_serialized),
        }


_RE_ENTRY = re.compile(r"ptxas\s+info\s*:\s*Compiling entry function '([^']+)'")
_RE_PROPS = re.compile(r"ptxas\s+info\s*:\s*Function properties for (\S+)")
_RE_FRAME = re.compile(
    r"(\d+) bytes stack frame,\s*(\d+) bytes spill stores,\s*(\d+) bytes spill loads"
)
_RE_USED = re.compile(r"ptxas\s+info\s*:\s*Used (\d+) registers(.*)")
_RE_WGMMA = re.compile(
    r"wgmma\.mma_async instructions are serialized(?: due to (.*?))?(?: in the function '([^']+)')?\s*\.?\s*$"
)
_RE_ADVISORY = re.compile(r"ptxas\s+(?:info|warning)\s*:\s*\(C\d+\).*")


def parse_ptxas(log: str) -> PtxasReport:
    """Parse the ``ptxas info`` lines of an nvcc ``-Xptxas -v`` log.

    Resource lines ("Used N registers, used M barriers, S bytes smem, C bytes cmem[0]") follow
    "Compiling entry function 'X'"; the stack/spill line follows "Function properties for X".
    Non-entry (device) functions' properties are ignored. Unknown lines are skipped, so the
    parser tolerates format drift between CUDA versions (missing fields read as 0).
    """
    kernels: dict[str, dict[str, int]] = {}
    order: list[str] = []
    current: str | None = None
    props_for: str | None = None
    wgmma: list[tuple[str, str]] = []
    advisories: list[str] = []
    for raw in log.splitlines():
        line = raw.strip()
        m = _RE_ENTRY.search(line)
        if m:
            current = m.group(1)
            if current not in kernels:
                kernels[current] = {}
                order.append(current)
            props_for = None
            continue
        m = _RE_PROPS.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = _RE_FRAME.search(line)
        if m and props_for is not None:
            if props_for in kernels:
                kernels[props_for].update(
                    stack_frame=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3))
                )
            props_for = None
            continue
        m = _RE_USED.search(line)
        if m and current is not None:
            rest = m.group(2)
            k = kernels[current]
            k["registers"] = int(m.group(1))
            for key, pat in (("barriers", r"(\d+) barriers"), ("smem_bytes", r"(\d+) bytes smem")):
                mm = re.search(pat, rest)
                if mm:
                    k[key] = int(mm.group(1))
            k["cmem_bytes"] = sum(int(x) for x in re.findall(r"(\d+) bytes cmem\[\d+\]", rest))
            continue
        if _RE_ADVISORY.search(line) or "Potential Performance Loss" in line:
            advisories.append(line)
        m = _RE_WGMMA.search(line)
        if m:
            wgmma.append(((m.group(2) or "").strip(), (m.group(1) or "").strip()))
    return PtxasReport(
        kernels=tuple(KernelResources(name=n, **kernels[n]) for n in order),
        wgmma_serialized=tuple(wgmma),
        advisories=tuple(advisories),
    )


_DIAG_START = re.compile(r"^(?:\S.*?(?:\(\d+\)|:\d+:\d+):\s|ptxas|nvcc|nvlink|/usr/bin/ld|collect2|\S+\.(?:cu|h|hpp|cuh)\b)")


def extract_errors(log: str, max_lines: int = ERRORS_MAX_LINES, max_bytes: int = ERRORS_MAX_BYTES) -> str:
    """The part of a compile log worth showing a repair prompt.

    Keeps the first ``max_lines`` lines that contain "error" (case-insensitive), each with
    the context lines nvcc prints under it (the offending source line and caret, "detected
    during instantiation ..." notes), up to the next diagnostic; trimmed to ``max_bytes``.
    """
    lines = log.splitlines()
    out: list[str] = []
    n_err = 0
    i = 0
    while i < len(lines) and n_err < max_lines:
        line = lines[i]
        if "error" in line.lower():
            n_err += 1
            out.append(line.rstrip())
            j = i + 1
            ctx = 0
            while j < len(lines) and ctx < 8:
                nxt = lines[j]
                if not nxt.strip() or (_DIAG_START.match(nxt) and not nxt.startswith((" ", "\t"))):
                    break
                out.append(nxt.rstrip())
                ctx += 1
                j += 1
            i = j
        else:
            i += 1
    text = "\n".join(out)
    if not text:  # e.g. killed by a signal without a message: fall back to the log's tail
        text = "\n".join(lines[-20:])
    if len(text.encode()) > max_bytes:
        text = text.encode()[: max_bytes - 20].decode("utf-8", "ignore").rstrip() + "\n... [truncated]"
    return text


def trim_log(log: str, max_bytes: int = LOG_MAX_BYTES) -> str:
    """Head and tail of a log within ``max_bytes`` (errors come first, summaries last)."""
    raw = log.encode()
    if len(raw) <= max_bytes:
        return log
    head = raw[: max_bytes * 3 // 4].decode("utf-8", "ignore")
    tail = raw[-(max_bytes // 4 - 64) :].decode("utf-8", "ignore")
    return f"{head}\n... [{len(raw) - len(head.encode()) - len(tail.encode())} bytes omitted] ...\n{tail}"


def _sanitize(log: str, workdir: str) -> str:
    """Replace the private temp dir and the CUTLASS path so logs are stable and short."""
    log = log.replace(workdir + os.sep, "").replace(workdir, ".")
    try:
        log = log.replace(str(cutlass_include_dir()), "<cutlass>")
    except CutlassNotFound:  # pragma: no cover
        pass
    return log
