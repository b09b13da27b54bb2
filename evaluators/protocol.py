"""What passes between the judge (trusted, :mod:`evaluators.judge`) and the runner (the one
process that loads a candidate, :mod:`evaluators.runner`): one line-based text protocol over
the runner's stdin (commands) and stdout (replies), typed here on the judge's side.

Why text lines: the runner is a small C++ program with no Python in it, and everything it
says after it loaded the candidate is said by a process the candidate controls. So a reply is
parsed strictly (:func:`parse_reply`): one ASCII line of at most :data:`MAX_LINE` bytes, a
known keyword, the exact number of tokens, numbers in range; anything else raises
:class:`ProtocolViolation`, which the judge records as the candidate's ``crash``. No reply
is ever read as a verdict: a runner reports only an event time and the return codes of one
call; whether the call was correct, and how fast, is decided by the judge from memory it
owns and from its own clock.

Commands (judge -> runner), one line each:

``HELLO <version>``
    first line; the runner answers ``READY <version> <backend>`` (``cuda`` or ``host``).
``MAP <buf> ipc <handle-hex> <nbytes>`` / ``MAP <buf> host <path> <nbytes>``
    make buffer ``<buf>`` (a small integer) visible: a CUDA IPC handle of a device
    allocation the judge made for this buffer alone, or a file the judge created (host
    backend: the CPU stand-in of the tests). Answer ``MAPPED <buf>``.
``NULLCALL``
    before the candidate is loaded, time the runner's own empty launch exactly as ``CALL``
    times the candidate's (events around it, device-wide synchronise): the judge's clock over
    these round trips is the overhead it subtracts when it corroborates the runner's times.
    Answer ``DONE 0 0 <ms>``.
``SECCOMP <path>``
    install the seccomp-bpf program in ``<path>`` (``struct sock_filter`` records, 8 bytes
    each, made by :func:`evaluators.sandbox.seccomp.seccomp_program` for the runner's pid)
    with ``PR_SET_NO_NEW_PRIVS`` and ``SECCOMP_FILTER_FLAG_TSYNC``. Answer ``SECCOMPED
    <threads>``.
``LOAD <path>``
    ``dlopen`` the candidate (its constructors are its first code, so ``SECCOMP`` comes first)
    and find ``evo_launch`` (and ``evo_workspace_bytes`` if defined). Answer ``LOADED <0|1>``
    (1: it defines a workspace).
``CALL <n_in> <tensor>... <n_out> <tensor>... <n_scalars> <scalar>...``
    one call of ``evo_launch`` on the runner's stream with these tensors (``<tensor>`` is
    ``<buf> <byte offset> <dtype code> <ndim> <shape>... <strides>...``, strides in
    elements); a workspace, when the candidate asks for one, is the runner's own memory,
    filled with 0xFF bytes before the call. Answer ``DONE <rc> <last_error> <ms>``: the
    return code, ``cudaGetLastError`` after a device-wide synchronise, and the time between
    events recorded on the stream around the call.
``QUIT``
    exit 0.

Any command may be answered ``ERR <where> <message>`` (``where`` one token): before ``LOAD``
that is our failure (the runner could not map memory or start CUDA); after it, the
candidate's. A runner that exits, closes its stdout, says something else or is silent past
the judge's deadline is the candidate's ``crash`` or ``timeout`` once it was loaded.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from typing import Sequence

__all__ = [
    "PROTOCOL_VERSION", "MAX_LINE", "Mode", "DTYPE_CODES", "ProtocolViolation",
    "BufferMap", "TensorArg", "Ready", "Mapped", "Seccomped", "Loaded", "Done", "Failed",
    "Reply", "hello", "map_ipc", "map_host", "nullcall", "seccomp", "load", "call", "quit_",
    "parse_reply", "timing_after",
]

#: Version of the judge/runner protocol; stored with every time (``env["protocol"]``).
PROTOCOL_VERSION = "2"
#: Longest line either side accepts (bytes, newline included).
MAX_LINE = 1 << 16


class Mode(str, enum.Enum):
    """What one evaluation does."""

    #: correctness only (``evo check --no-timing``, the self-test, check-only runs)
    CHECK = "check"
    #: correctness, then timing once correctness passed
    CHECK_TIME = "check+time"
    #: timing only, of a binary already found correct
    TIME_ONLY = "time-only"
    #: correctness, then timing interleaved call by call with a baseline's binary, each in a
    #: runner of its own (champion confirmation: the champion against the task's seed)
    PAIRED = "paired"

    @property
    def checks(self) -> bool:
        return self is not Mode.TIME_ONLY

    @property
    def times(self) -> bool:
        return self is not Mode.CHECK


def timing_after(mode: Mode, correctness_status: str | None) -> str | None:
    """The one rule for "correctness, then timing or skipped": ``None`` when timing runs,
    else the reason it is skipped. ``correctness_status`` is the correctness stage's status
    value (``None`` when correctness was not run, i.e. ``time-only``)."""
    if not mode.times:
        return "check-only mode"
    if correctness_status in (None, "ok", "skipped"):
        return None
    return f"not run: correctness {correctness_status}"


#: torch dtype name -> the ABI's EvoDType code (evaluators/abi/evo_abi.h)
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3, "int32": 4, "int64": 5,
               "uint8": 6, "bool": 7}


class ProtocolViolation(Exception):
    """A runner said something outside this protocol (or nothing): a crash, never a result."""


@dataclass(frozen=True)
class BufferMap:
    """One exchange buffer as the runner is told to map it."""

    buf: int
    kind: str            # "ipc" | "host"
    where: str           # the IPC handle in hex, or the host file's path
    nbytes: int

    def line(self) -> str:
        if self.kind not in ("ipc", "host"):
            raise ValueError(f"buffer kind {self.kind!r}: expected 'ipc' or 'host'")
        if not self.where or any(c.isspace() for c in self.where):
            raise ValueError(f"buffer {self.buf}: {self.where!r} must be one token")
        return f"MAP {int(self.buf)} {self.kind} {self.where} {int(self.nbytes)}"


@dataclass(frozen=True)
class TensorArg:
    """A tensor the runner passes to ``evo_launch``: a view into a mapped buffer."""

    buf: int
    offset: int
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    def tokens(self) -> list[str]:
        if len(self.shape) != len(self.strides) or len(self.shape) > 8:
            raise ValueError(f"tensor of shape {self.shape} and strides {self.strides}: at most 8 dims, one stride each")
        return [str(int(self.buf)), str(int(self.offset)), str(DTYPE_CODES[self.dtype]), str(len(self.shape)),
                *(str(int(s)) for s in self.shape), *(str(int(s)) for s in self.strides)]


def hello() -> str:
    return f"HELLO {PROTOCOL_VERSION}"


def map_ipc(buf: int, handle: bytes, nbytes: int) -> str:
    return BufferMap(buf, "ipc", handle.hex(), nbytes).line()


def map_host(buf: int, path: str, nbytes: int) -> str:
    return BufferMap(buf, "host", path, nbytes).line()


def nullcall() -> str:
    return "NULLCALL"


def seccomp(path: str) -> str:
    return f"SECCOMP {path}"


def load(path: str) -> str:
    return f"LOAD {path}"


def call(inputs: Sequence[TensorArg], outputs: Sequence[TensorArg], scalars: Sequence[float]) -> str:
    toks = ["CALL", str(len(inputs))]
    for t in inputs:
        toks += t.tokens()
    toks.append(str(len(outputs)))
    for t in outputs:
        toks += t.tokens()
    toks.append(str(len(scalars)))
    toks += [repr(float(s)) for s in scalars]
    return " ".join(toks)


def quit_() -> str:
    return "QUIT"



# --- replies ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ready:
    version: str
    backend: str


@dataclass(frozen=True)
class Mapped:
    buf: int


@dataclass(frozen=True)
class Seccomped:
    threads: int


@dataclass(frozen=True)
class Loaded:
    workspace: bool


@dataclass(frozen=True)
class Done:
    """One call's report: its return code, ``cudaGetLastError`` after it, the runner's event
    time (ms). The judge believes none of it about correctness; the time only once its own
    clock agrees (:mod:`evaluators.judge.corroborate`)."""

    rc: int
    last_error: int
    ms: float


@dataclass(frozen=True)
class Failed:
    where: str
    message: str


Reply = Ready | Mapped | Seccomped | Loaded | Done | Failed

_INT = re.compile(r"^-?[0-9]{1,12}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9 _.:-]")


def _q(text: str, n: int = 32) -> str:
    """What a runner said, as quoted in a verdict's reason: short and with only harmless
    characters (reasons reach repair prompts, and a runner's words are the candidate's)."""
    return repr(_UNSAFE.sub("?", text[:n]) + ("..." if len(text) > n else ""))
_WORD = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def _int(tok: str, line: str) -> int:
    if not _INT.match(tok):
        raise ProtocolViolation(f"expected an integer, got {_q(tok, 16)} in {_q(line)}")
    return int(tok)


def _float(tok: str, line: str) -> float:
    try:
        v = float(tok)
    except ValueError:
        raise ProtocolViolation(f"expected a number, got {_q(tok, 16)} in {_q(line)}") from None
    if not math.isfinite(v) or len(tok) > 40:
        raise ProtocolViolation(f"expected a finite number, got {_q(tok, 16)} in {_q(line)}")
    return v


def parse_reply(raw: bytes) -> Reply:
    """One reply line (with or without its newline) as a typed record; raises
    :class:`ProtocolViolation` for anything outside the grammar above."""
    if len(raw) > MAX_LINE:
        raise ProtocolViolation(f"reply of {len(raw)} bytes (at most {MAX_LINE})")
    try:
        line = raw.decode("ascii").rstrip("\n")
    except UnicodeDecodeError:
        raise ProtocolViolation(f"reply is not ASCII ({len(raw)} bytes)") from None
    if not line or any(c in line for c in "\r\0\n"):
        raise ProtocolViolation(f"malformed reply line {_q(line)}")
    toks = line.split(" ")
    key, args = toks[0], toks[1:]
    if key == "ERR":
        if not args or not _WORD.match(args[0]):
            raise ProtocolViolation(f"malformed ERR reply {_q(line)}")
        return Failed(args[0], " ".join(args[1:])[:2000])
    want = {"READY": 2, "MAPPED": 1, "SECCOMPED": 1, "LOADED": 1, "DONE": 3}.get(key)
    if want is None:
        raise ProtocolViolation(f"unknown reply {_q(key, 16)} in {_q(line)}")
    if len(args) != want:
        raise ProtocolViolation(f"{key} takes {want} fields, got {len(args)}: {_q(line)}")
    if key == "READY":
        if args[1] not in ("cuda", "host") or not _WORD.match(args[0]):
            raise ProtocolViolation(f"malformed READY reply {_q(line)}")
        return Ready(args[0], args[1])
    if key == "MAPPED":
        return Mapped(_int(args[0], line))
    if key == "SECCOMPED":
        return Seccomped(_int(args[0], line))
    if key == "LOADED":
        if args[0] not in ("0", "1"):
            raise ProtocolViolation(f"malformed LOADED reply {_q(line)}")
        return Loaded(args[0] == "1")
    ms = _float(args[2], line)
    if ms < 0:
        raise ProtocolViolation(f"negative event time in {_q(line)}")
    return Done(_int(args[0], line), _int(args[1], line), ms)
