"""The forbidden-name rules: calls and types a candidate's code must not name.

Each rule is a :class:`Names` table scanned over the code view and over the bodies of
``#define`` directives (so ``#define RUN system`` is caught where it is defined). Names are
looked up in the reader's identifier index, not searched for one regex at a time, so a rule
costs a few dictionary lookups however long the source is.

Kinds of name (see :class:`Names`): distinctive names count wherever they appear and however
they are qualified (``system``, ``q::system`` after ``namespace q = std;``, ``(system)``,
``&system``); common words (``exit``, ``send``, ``time``) only where they can only be the
library's: called, parenthesised and called, address taken, qualified by a name that may
stand for ``std`` (``::exit``, ``std::exit``, an alias), or inside a ``#define``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Callable

from evaluators.policy.base import Violation
from evaluators.policy.reader import (
    ParsedSource,
    count_args,
    declares,
    is_member,
    next_nonspace,
    prev_nonspace,
    qualifier,
)

__all__ = ["Names", "scan_names", "names_rule", "check_process", "check_library", "check_side_stream",
           "check_python_api", "FILE_IO", "NETWORK", "THREADS", "ENV", "TIME"]


@dataclass(frozen=True)
class Names:
    """Forbidden identifiers of one rule.

    ``anywhere``: flagged wherever they appear as an identifier, however qualified.
    ``calls``: common words, flagged only where they must be the library's (see the module).
    ``std_words``: flagged only as ``std::word`` (or an alias of ``std``), or unqualified in a
    source that has a ``using namespace std``.
    ``ident_patterns``: regexes an identifier must match as a whole (``cublas\\w*``).
    ``patterns``: regexes over the text, each starting with a literal (fast to search); the
    match must start an identifier. ``unqualified_patterns``: the same, skipped after ``::``.
    ``max_args``: for names in ``calls``, only flag calls with at most this many arguments.
    """

    anywhere: tuple[str, ...] = ()
    calls: tuple[str, ...] = ()
    std_words: tuple[str, ...] = ()
    ident_patterns: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    unqualified_patterns: tuple[str, ...] = ()
    max_args: tuple[tuple[str, int], ...] = ()
    what: str = "forbidden name"


def _defines_itself(view: str, offset: int, name: str) -> bool:
    """Whether ``name`` at ``offset`` is the macro *named* by its ``#define`` line."""
    line = view[view.rfind("\n", 0, offset) + 1 :]
    return bool(re.match(r"\s*(?:#|%:)\s*define\s+" + re.escape(name) + r"\b", line))


def _library_use(p: ParsedSource, view: str, off: int, name: str, in_define: bool, max_args: dict[str, int]) -> bool:
    """Whether a common word at ``off`` can only be the library's function (kind ``calls``)."""
    q = qualifier(view, off)
    std_q = q is not None and q in p.std_names
    if q is not None and not std_q:
        return False  # `cute::remove<0>(t)`: another namespace's function
    nxt = next_nonspace(view, off + len(name))
    called = nxt < len(view) and view[nxt] == "("
    before = prev_nonspace(view, off)
    paren_called = (before >= 0 and view[before] == "(" and nxt < len(view) and view[nxt] == ")"
                    and next_nonspace(view, nxt + 1) < len(view) and view[next_nonspace(view, nxt + 1)] == "(")
    address = before >= 0 and view[before] == "&" and (before == 0 or view[before - 1] != "&")
    if called and not std_q and declares(view, off):
        return False  # `void send(int)`: a declaration of the candidate's own function
    if not (called or paren_called or address or std_q or in_define):
        return False
    if called and name in max_args and count_args(view, nxt) > max_args[name]:
        return False
    return True


@functools.lru_cache(maxsize=64)
def _ident_re(patterns: tuple[str, ...]) -> Callable[[str], Any] | None:
    return re.compile("|".join(f"(?:{x})" for x in patterns)).fullmatch if patterns else None


def scan_names(p: ParsedSource, rule: str, names: Names) -> list[Violation]:
    out: list[Violation] = []
    seen: set[tuple[int, str]] = set()
    anywhere = set(names.anywhere)
    calls = set(names.calls)
    std_words = set(names.std_words)
    max_args = dict(names.max_args)
    ident_re = _ident_re(names.ident_patterns)

    def add(view: str, off: int, token: str, in_define: bool) -> None:
        line = p.line(off)
        if (line, token) in seen:
            return
        seen.add((line, token))
        out.append(Violation(rule, line, f"{names.what} `{token}`" + (" (in a #define)" if in_define else "")))

    # the code view plus the bodies of #define directives (macro aliases of forbidden names)
    for view, in_define in ((p.code, False), (p.macro_code, True)):
        index = p.idents(view)
        found: list[tuple[int, str, str]] = []
        for name in anywhere | calls | std_words:
            found.extend((off, name, "name") for off in index.get(name, ()))
        if ident_re is not None:
            for name, offs in index.items():
                if ident_re(name):
                    found.extend((off, name, "anywhere") for off in offs)
        for off, name, _ in sorted(found):
            if in_define and _defines_itself(view, off, name):
                continue  # a macro *named* like a libc function is not a call to it
            if is_member(view, off):
                continue
            if name in anywhere or name not in (calls | std_words):
                add(view, off, name, in_define)
            elif name in std_words:
                q = qualifier(view, off)
                if (q and q in p.std_names) or (q is None and p.uses_std):
                    add(view, off, name, in_define)
            elif _library_use(p, view, off, name, in_define, max_args):
                add(view, off, name, in_define)
        for pats, unqualified in ((names.patterns, False), (names.unqualified_patterns, True)):
            for pat in pats:
                for m in re.finditer(pat, view):
                    s = m.start()
                    if s > 0 and (view[s - 1].isalnum() or view[s - 1] == "_"):
                        continue  # inside a longer identifier
                    if is_member(view, s) or (unqualified and qualifier(view, s) is not None):
                        continue
                    add(view, s, re.sub(r"\s+", "", m.group(0)).rstrip("("), in_define)
    return sorted(out, key=lambda v: v.line)


@dataclass(frozen=True)
class _NamesCheck:
    """Picklable callable: scan for one rule's forbidden names."""

    rule: str
    names: Names

    def __call__(self, p: ParsedSource) -> list[Violation]:
        return scan_names(p, self.rule, self.names)


def names_rule(rule: str, names: Names) -> Callable[[ParsedSource], list[Violation]]:
    return _NamesCheck(rule, names)


# ---------------------------------------------------------------------------------------------
# Tables

PROCESS = Names(
    anywhere=("system", "popen", "fork", "vfork", "execl", "execlp", "execle", "execv", "execvp",
              "execvpe", "execve", "execveat", "fexecve", "posix_spawn", "posix_spawnp", "wordexp", "syscall",
              "ptrace", "prctl", "mmap", "mmap64", "mprotect", "dlopen", "dlmopen", "dlsym", "dlvsym", "dladdr",
              "dladdr1", "dlinfo", "dl_iterate_phdr", "_r_debug", "_DYNAMIC", "link_map", "getauxval",
              "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd", "pidfd_send_signal",
              "memfd_create", "personality", "unshare", "setns", "sigaction", "at_quick_exit", "quick_exit",
              "atexit", "_Exit", "_exit", "cuGetProcAddress", "cuGetProcAddress_v2", "cudaGetDriverEntryPoint",
              "cudaGetDriverEntryPointByVersion"),
    calls=("clone", "kill", "signal", "raise", "exit", "ioctl"),
    ident_patterns=(r"__libc_\w+", r"__NR_\w+", r"SYS_[a-z]\w*", r"_IO_\w*popen\w*"),
    what="process/loader call",
)


def check_process(p: ParsedSource) -> list[Violation]:
    out = scan_names(p, "no-host-process", PROCESS)
    # driver entry-point lookup is the one legitimate dynamic lookup (TMA descriptors): allow
    # it only with a literal cuTensorMap* name, so it cannot fetch a forbidden function.
    keep = []
    for v in out:
        if "GetDriverEntryPoint" in v.message or "GetProcAddress" in v.message:
            ok = False
            for m in re.finditer(r"\b(cudaGetDriverEntryPoint\w*|cuGetProcAddress\w*)\s*\(\s*\"(cuTensorMap\w*)\"",
                                 p.nocomment):
                if p.line(m.start()) == v.line:
                    ok = True
            if ok:
                continue
            v = Violation(v.rule, v.line, v.message + ": only a literal \"cuTensorMap...\" name may be looked up")
        keep.append(v)
    return keep


FILE_IO = Names(
    anywhere=("fopen", "fopen64", "freopen", "fdopen", "openat", "creat", "unlink", "unlinkat",
              "renameat", "fwrite", "fread", "fprintf", "fputs", "fgets", "fscanf", "mkdir", "rmdir",
              "chmod", "symlink", "truncate", "ftruncate", "opendir", "readdir", "FILE", "ifstream", "ofstream",
              "fstream", "filebuf", "basic_filebuf", "basic_ifstream", "basic_ofstream", "basic_fstream",
              "filesystem"),
    calls=("open", "rename", "remove"),
    max_args=(("remove", 1),),
    what="file I/O",
)
NETWORK = Names(
    anywhere=("socket", "socketpair", "getaddrinfo", "gethostbyname", "inet_pton", "inet_addr",
              "sendto", "sendmsg", "recvfrom", "recvmsg", "accept4", "setsockopt"),
    calls=("connect", "bind", "listen", "accept", "send", "recv"),
    what="network call",
)
THREADS = Names(
    anywhere=("thrd_create", "__thread", "jthread", "this_thread", "packaged_task"),
    std_words=("thread", "async"),
    ident_patterns=(r"pthread_\w+",),
    what="host threading",
)
ENV = Names(
    anywhere=("getenv", "secure_getenv", "setenv", "unsetenv", "putenv", "clearenv", "environ", "__environ"),
    what="environment access",
)
TIME = Names(
    anywhere=("gettimeofday", "clock_gettime", "clock_getres", "timespec_get", "usleep", "nanosleep",
              "sleep_for", "sleep_until", "__rdtsc", "rdtsc", "chrono", "steady_clock", "system_clock",
              "high_resolution_clock"),
    calls=("time", "clock", "sleep"),
    what="host time/sleep",
)
LIBRARY = Names(
    anywhere=("ATen",),
    ident_patterns=(r"cublas\w*", r"cudnn\w*", r"cusparse\w*", r"cufft\w*", r"cusolver\w*", r"cutensor\w*"),
    patterns=(r"c10\s*::", r"gemm\s*::\s*device\b", r"conv\s*::\s*device\b", r"reduction\s*::\s*device\b",
              r"cutlass\s*::\s*library\b", r"thrust\s*::", r"cub\s*::\s*Device\w*"),
    unqualified_patterns=(r"torch\s*::", r"at\s*::\s*\w"),
    what="library fallback",
)

_LIBRARY_INCLUDES = (
    r"cutlass/gemm/device/.*",
    r"cutlass/conv/device/.*",
    r"cutlass/reduction/device/.*",
    r"cutlass/library/.*",
)


def include_path(body: str) -> str | None:
    """The path of an ``#include`` body written as ``<...>`` or ``"..."`` (None if computed)."""
    m = re.match(r'\s*(?:<([^>]*)>|"([^"]*)")', body)
    return None if not m else (m.group(1) if m.group(1) is not None else m.group(2)).strip()


def check_library(p: ParsedSource) -> list[Violation]:
    out = scan_names(p, "no-library-fallback", LIBRARY)
    for d in p.directives:
        path = include_path(d.body) if d.name == "include" else None
        if path and any(re.fullmatch(x, path) for x in _LIBRARY_INCLUDES):
            out.append(Violation("no-library-fallback", d.line,
                                 f"#include of `{path}`: CUTLASS device-level GEMM/conv wrappers are a library fallback"))
    return sorted(out, key=lambda v: v.line)


PYTHON_API = Names(
    ident_patterns=(r"_?Py[A-Z_]\w*", r"pybind11\w*", r"PYBIND11_\w*"),
    what="Python C API",
)


def check_python_api(p: ParsedSource) -> list[Violation]:
    """The candidate runs inside a Python process (the harness): ``PyRun_SimpleString`` or
    ``PyGILState_Ensure`` need no forbidden name to run arbitrary Python there."""
    out = scan_names(p, "no-python-api", PYTHON_API)
    for d in p.directives:
        path = include_path(d.body) if d.name == "include" else None
        if path and re.search(r"(?i)(?:^|/)(?:python[\w.]*\.h|pybind11/|numpy/|structmember\.h)", path):
            out.append(Violation("no-python-api", d.line, f"#include of `{path}`: the Python C API"))
    return sorted(out, key=lambda v: v.line)


SIDE_STREAM = Names(
    anywhere=("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaThreadSynchronize", "cudaDeviceReset",
              "cudaSetDevice", "cudaHostAlloc", "cudaHostRegister", "cudaLaunchHostFunc", "cudaStreamAddCallback",
              "cudaStreamWaitEvent", "cudaStreamPerThread", "cudaStreamLegacy", "cudaStreamEndCapture",
              "cuCtxSynchronize", "cuStreamSynchronize", "cuLaunchHostFunc", "cuStreamAddCallback",
              "cuDevicePrimaryCtxReset", "cuMemHostAlloc"),
    ident_patterns=(
        r"cudaStreamCreate\w*", r"cudaMalloc\w*", r"cudaFree\w*", r"cudaEvent\w*", r"cudaGraph\w*",
        r"cudaStreamBeginCapture\w*", r"cuStreamCreate\w*", r"cuCtx(?:Create|Destroy|SetCurrent|PushCurrent|PopCurrent)\w*",
        r"cuEvent\w*", r"cuGraph\w*", r"cuMemAlloc\w*", r"cuMemFree\w*",
    ),
    patterns=(
        r"cudaMemcpy\w*(?<!Async)\s*\(", r"cudaMemset\w*(?<!Async)\s*\(",
        r"cuMemcpy\w*(?<!Async)\s*\(", r"cuMemsetD\w*(?<!Async)\s*\(",
    ),
    what="stream/sync/allocation call",
)

_DEFAULT_STREAMS = {"0", "nullptr", "NULL", "0L", "0UL", "cudaStreamLegacy", "cudaStreamPerThread", "{}"}


def check_side_stream(p: ParsedSource) -> list[Violation]:
    out = scan_names(p, "no-side-stream-or-sync", SIDE_STREAM)
    for code in (p.code, p.macro_code):
        out.extend(_check_launches(p, code))
    return sorted(out, key=lambda v: v.line)


def _check_launches(p: ParsedSource, code: str) -> list[Violation]:
    """Every ``<<<...>>>`` launch must name a stream, and not the default one."""
    out = []
    for m in re.finditer(r"<<<", code):
        end = code.find(">>>", m.end())
        if end < 0:
            continue
        args, depth, cur = [], 0, []
        for ch in code[m.end() : end]:
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            if ch == "," and depth == 0:
                args.append("".join(cur).strip())
                cur = []
            else:
                cur.append(ch)
        args.append("".join(cur).strip())
        line = p.line(m.start())
        if len(args) < 4:
            out.append(Violation("no-side-stream-or-sync", line,
                                 "kernel launch without a stream runs on the default stream; pass the `stream` argument"))
        elif re.sub(r"\s+", "", args[3]) in _DEFAULT_STREAMS or re.fullmatch(r"\(\s*cudaStream_t\s*\)\s*0", args[3]):
            out.append(Violation("no-side-stream-or-sync", line,
                                 f"kernel launch on stream `{args[3]}`; launch on the harness's `stream`"))
    return out
