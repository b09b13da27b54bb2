"""The policy's rules, in the order they are applied: :data:`POLICY_RULES`.

The rules themselves live in :mod:`~evaluators.policy.names` (forbidden names) and
:mod:`~evaluators.policy.structure` (scopes, asm, linkage, entry point); this module holds the
directive-level and whole-source rules (size, lexing problems, includes, token pasting,
redefined keywords, tunable values) and assembles the tuple.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from evo.core.records import canonical_params

from evaluators.policy import names as nm
from evaluators.policy import structure as st
from evaluators.policy.base import Rule, Violation
from evaluators.policy.reader import (
    ASM_WORDS,
    BUILTIN_DEVICE_MACROS,
    BUILTIN_HOST_MACROS,
    CONST_MACROS,
    ParsedSource,
    parse_source,
)

__all__ = ["POLICY_RULES", "MAX_SOURCE_BYTES", "MAX_SOURCE_LINES", "ALLOWED_INCLUDE_PATTERNS", "include_allowed",
           "param_violations", "TRUSTED_NAMES"]

MAX_SOURCE_BYTES = 200 * 1024
MAX_SOURCE_LINES = 5000


def check_size(p: ParsedSource) -> list[Violation]:
    out = []
    raw = p.original.encode("utf-8", errors="replace")
    if len(raw) > MAX_SOURCE_BYTES:
        line = raw[:MAX_SOURCE_BYTES].count(b"\n") + 1
        out.append(Violation("size-limit", line, f"source is {len(raw)} bytes; the limit is {MAX_SOURCE_BYTES}"))
    n_lines = p.original.count("\n") + (0 if p.original.endswith("\n") or not p.original else 1)
    if n_lines > MAX_SOURCE_LINES:
        out.append(Violation("size-limit", MAX_SOURCE_LINES + 1,
                             f"source has {n_lines} lines; the limit is {MAX_SOURCE_LINES}"))
    return out


def check_plain_source(p: ParsedSource) -> list[Violation]:
    """Text whose meaning to the compiler the reader cannot be sure of."""
    return [Violation("plain-source", p.line(off), msg) for off, msg in p.problems]


# ---------------------------------------------------------------------------------------------
# include-allowlist


def include_allowed(path: str) -> bool:
    """Whether an ``#include`` path is on the allowlist (see ``ALLOWED_INCLUDE_PATTERNS``)."""
    if ".." in path.split("/") or path.startswith("/") or "\\" in path:
        return False
    return any(re.fullmatch(p, path) for p in ALLOWED_INCLUDE_PATTERNS)


#: Regexes (full match) of the include paths a candidate may use. Standard headers are the
#: compile-time ones; no host I/O (<cstdio>, <iostream>, <fstream>), no <cstdlib>, <thread>,
#: <chrono>; no other CUDA libraries (cuBLAS, cuDNN, CUB, Thrust).
ALLOWED_INCLUDE_PATTERNS: tuple[str, ...] = (
    r"cute/[\w./-]+",
    r"cutlass/[\w./-]+",
    r"cuda/[\w./-]+",
    r"cuda[\w]*\.h",
    r"cooperative_groups\.h",
    r"cooperative_groups/[\w./-]+",
    r"mma\.h",
    r"evo_abi\.h",
    r"cstdint|cstddef|cmath|math\.h|stdint\.h|stddef\.h|float\.h|limits\.h|cfloat|climits",
    r"type_traits|utility|limits|algorithm|array|tuple|initializer_list|numeric|cassert|assert\.h",
)


def check_includes(p: ParsedSource) -> list[Violation]:
    out = []
    for d in p.directives:
        if d.name not in ("include", "include_next", "import", "embed"):
            continue
        if d.name != "include":
            out.append(Violation("include-allowlist", d.line, f"#{d.name} is not allowed (only #include)"))
            continue
        path = nm.include_path(d.body)
        if path is None:
            out.append(Violation("include-allowlist", d.line,
                                 f"computed #include `{d.body[:60]}`: write the header path literally"))
        elif not include_allowed(path):
            out.append(Violation("include-allowlist", d.line, f"#include of `{path}` is not on the allowlist"))
    return out


def check_token_paste(p: ParsedSource) -> list[Violation]:
    out = []
    for d in p.directives:
        if d.name == "define":
            body_code = p.macro_code[d.offset : d.end]  # literal contents blanked: "##" in a string is fine
            if "##" in body_code or "%:%:" in body_code:
                out.append(Violation("no-token-pasting", d.line,
                                     "token pasting (##) can assemble forbidden names; write identifiers out"))
    return out


# ---------------------------------------------------------------------------------------------
# no-redefined-keywords

_KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class
compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype
default defined delete do double dynamic_cast else enum explicit export extern false float for friend goto if
inline int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public
register reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch
template this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
wchar_t while xor xor_eq _Pragma
""".split())

#: Names whose meaning the reader relies on: C++ keywords, CUDA's execution-space and memory
#: specifiers, the CuTe/CUTLASS macros it knows, and everything the implementation reserves
#: (``__x``, ``_X``: ``__device__``, ``__CUDA_ARCH__``, ``__attribute__`` are all macros or
#: keywords the compiler gives meaning to).
TRUSTED_NAMES = _KEYWORDS | BUILTIN_DEVICE_MACROS | BUILTIN_HOST_MACROS | CONST_MACROS | {"EVO_EXPORT"}
_RESERVED = re.compile(r"__\w*|_[A-Z]\w*")
#: Reserved names a kernel may define: CUDA's opt-outs of the half/bfloat16 operator overloads
#: (PyTorch builds pass them); they remove overloads and change nothing the reader relies on.
_HARMLESS_RESERVED = re.compile(r"__CUDA_NO_(?:HALF|HALF2|BFLOAT16|BFLOAT162)_(?:OPERATORS|CONVERSIONS)__")


def trusted_name(name: str) -> bool:
    """Keywords, trusted macros and reserved names (``__CUDACC__`` decides what the CUDA
    headers make of ``__device__``, ``__cplusplus`` what every header declares)."""
    return name in TRUSTED_NAMES or (bool(_RESERVED.fullmatch(name)) and not _HARMLESS_RESERVED.fullmatch(name))


def check_redefined_keywords(p: ParsedSource) -> list[Violation]:
    """``#define const``, ``#define __device__`` or ``#undef CUTE_DEVICE`` change what the
    compiler reads under a name this check takes at its word (a mutable global that reads as
    ``const``, a host function that reads as ``__device__``)."""
    out = []
    for d in p.directives:
        if d.name in ("define", "undef"):
            m = re.match(r"([A-Za-z_$][\w$]*)", d.body)
            if m and trusted_name(m.group(1)):
                out.append(Violation("no-redefined-keywords", d.line,
                                     f"#{d.name} of `{m.group(1)}`: keywords, CUDA specifiers and reserved names "
                                     "keep their meaning"))
    return out


# ---------------------------------------------------------------------------------------------
# param-syntax

_PARAM_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_PARAM_VALUE = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?[A-Za-z]{0,3}|[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*")
#: Identifier values that would change how the source reads (not just what it computes).
_PARAM_DENY = frozenset({"static", "thread_local", "extern", "mutable", "__host__", "__managed__", "__attribute__",
                         "__attribute", "__declspec", "__pragma", "_Pragma", "alias", "weakref", "ifunc", "symver",
                         "constructor", "destructor"}) | ASM_WORDS
_PROBE_RULES = ("no-host-process", "no-host-file-io", "no-network", "no-threads", "no-env", "no-host-time",
                "no-library-fallback", "no-side-stream-or-sync", "no-python-api", "no-host-asm", "no-linker-tricks")


def check_params(p: ParsedSource) -> list[Violation]:
    return param_violations(p.params)


def param_violations(params: Mapping[str, Any] | tuple[tuple[str, str], ...] | None) -> list[Violation]:
    """Rule ``param-syntax`` on tunable values alone (the compile stage re-checks with it).

    Names must be plain identifiers (not keywords, reserved ``__x`` names or macros the
    reader trusts), values numbers or identifiers, and an identifier value must not name
    anything the call rules forbid (``-DTILE=system``) or change how code reads
    (``-DX=asm``, ``-DX=static``).
    """
    pairs = params if isinstance(params, tuple) else canonical_params(params)
    out = []
    for name, value in pairs:
        if not _PARAM_NAME.fullmatch(name) or trusted_name(name) or name == "evo_launch":
            out.append(Violation("param-syntax", 1, f"tunable name `{name[:40]}` is not a plain identifier"))
            continue
        if not _PARAM_VALUE.fullmatch(value):
            out.append(Violation("param-syntax", 1,
                                 f"tunable {name}={value[:40]!r}: values must be numbers or identifiers"))
            continue
        if re.match(r"[A-Za-z_]", value):
            if set(value.split("::")) & _PARAM_DENY:
                out.append(Violation("param-syntax", 1, f"tunable {name}={value}: a value may not be `{value}`"))
                continue
            # an identifier value must not smuggle a forbidden name into the source via -D
            probe = parse_source(f"int x = {value}(0);\n")
            for rule in POLICY_RULES:
                if rule.name in _PROBE_RULES and list(rule.check(probe)):
                    out.append(Violation("param-syntax", 1,
                                         f"tunable {name}={value}: value names something {rule.name} forbids"))
    return out


POLICY_RULES: tuple[Rule, ...] = (
    Rule("size-limit", f"sources are capped at {MAX_SOURCE_BYTES} bytes and {MAX_SOURCE_LINES} lines, so "
         "prompts, the store and the compiler stay bounded", check_size),
    Rule("plain-source", "the source must read the same to this check and to the compiler: no malformed or "
         "unterminated raw strings", check_plain_source),
    Rule("include-allowlist", "only CuTe/CUTLASS, CUDA and compile-time standard headers may be included; "
         "anything else (stdio, cstdlib, thread, cuBLAS...) opens a door the other rules then have to close",
         check_includes),
    Rule("no-token-pasting", "## can build any identifier (sys##tem) where no static check can see it",
         check_token_paste),
    Rule("no-redefined-keywords", "redefining a keyword, a CUDA specifier or a reserved name (#define const, "
         "#define __device__) makes code read differently to this check and to the compiler",
         check_redefined_keywords),
    Rule("no-host-process", "the candidate runs inside the evaluator's sandboxed runner: it must not start processes, "
         "load code (dlopen/dlsym), make raw syscalls, or end the process", nm.check_process),
    Rule("no-python-api", "the Python C API (PyRun_SimpleString, "
         "PyGILState_Ensure, any Py* symbol) would run arbitrary Python in the process that loads the kernel", nm.check_python_api),
    Rule("no-host-file-io", "reading or writing files could leak reference results between calls or tamper "
         "with the evaluator", nm.names_rule("no-host-file-io", nm.FILE_IO)),
    Rule("no-network", "a kernel has no business with sockets; results could be fetched from outside",
         nm.names_rule("no-network", nm.NETWORK)),
    Rule("no-threads", "host threads keep working after evo_launch returns, outside what the timer measures",
         nm.names_rule("no-threads", nm.THREADS)),
    Rule("no-env", "the environment is not an input; reading it lets a kernel detect the evaluator",
         nm.names_rule("no-env", nm.ENV)),
    Rule("no-host-time", "host clocks and sleeps let a kernel detect or pace the timer",
         nm.names_rule("no-host-time", nm.TIME)),
    Rule("no-library-fallback", "the search evolves hand-written CuTe kernels; calling cuBLAS/cuDNN/torch or "
         "CUTLASS's device-level GEMM wrappers would measure a library, not the candidate",
         nm.check_library),
    Rule("no-side-stream-or-sync", "all work must go on the stream evo_launch is given: side streams, the default stream, "
         "events, graphs, host callbacks, device-wide syncs and allocations escape or distort the timer",
         nm.check_side_stream),
    Rule("no-global-state", "mutable state that survives between calls lets a kernel cache results (by input "
         "pointer) and skip the work in timed runs", st.check_global_state),
    Rule("no-host-asm", "inline asm is for device code; in host code (a __host__ __device__ function's host side "
         "included) it could issue syscalls no name check sees", st.check_host_asm),
    Rule("no-linker-tricks", "asm labels, alias/weakref/ifunc/symver/constructor attributes and symbol-renaming "
         "pragmas bind a harmless-looking name to a forbidden function (or run code at load time)",
         st.check_linker_tricks),
    Rule("one-entry-point", "the runner calls exactly one `evo_launch` with the ABI signature from evo_abi.h",
         st.check_entry_point),
    Rule("param-syntax", "tunable values become -D macros; anything but a number or identifier could inject "
         "code past this check", check_params),
)
