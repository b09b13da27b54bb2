"""What the preprocessor lines tell the reader: macro roles, ``#ifdef __CUDA_ARCH__`` regions,
and the names that may stand for namespace ``std``.

None of this expands macros or evaluates ``#if``: each function answers one question the
rules need, conservatively (a redefinition can never make a scope look more trusted than its
least trusted definition; a condition the reader does not recognise is "compiled for the
host too").
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from evaluators.policy.reader import Directive, Frame

__all__ = ["ASM_WORDS", "BUILTIN_DEVICE_MACROS", "BUILTIN_HOST_MACROS", "CONST_MACROS", "macro_sets", "arch_marks",
           "std_names"]

#: Macros from CuTe/CUTLASS headers whose meaning the reader assumes (redefining them, or
#: any reserved name, is a violation of rule ``no-redefined-keywords``).
BUILTIN_DEVICE_MACROS = frozenset(
    {"CUTE_DEVICE", "CUTE_HOST_DEVICE", "CUTLASS_DEVICE", "CUTLASS_HOST_DEVICE", "CUTLASS_GLOBAL"}
)
BUILTIN_HOST_MACROS = frozenset({"CUTE_HOST_DEVICE", "CUTLASS_HOST_DEVICE", "CUTE_HOST", "CUTLASS_HOST"})
CONST_MACROS = frozenset({"CUTE_INLINE_CONSTANT"})
ASM_WORDS = frozenset({"asm", "__asm__", "__asm"})


def macro_sets(macros: Mapping[str, list[tuple[bool, str]]]) -> tuple[frozenset, frozenset, frozenset]:
    """(device, host, asm) macro names, each closed under macros that use them.

    A macro is a device macro only if every definition is object-like and names a device
    specifier; a host macro if any definition names ``__host__``; an asm macro if any
    definition contains ``asm`` (a redefinition cannot make a scope look more trusted).
    """
    words = {name: [set(re.findall(r"[A-Za-z_]\w*", body)) for _, body in defs] for name, defs in macros.items()}
    device = set(BUILTIN_DEVICE_MACROS)
    host = set(BUILTIN_HOST_MACROS)
    asm = set()
    changed = True
    while changed:
        changed = False
        for name, defs in macros.items():
            ws = words[name]
            if name not in device and all(not fn and w & ({"__device__", "__global__"} | device)
                                          for (fn, _), w in zip(defs, ws)):
                device.add(name)
                changed = True
            if name not in host and any(w & ({"__host__"} | host) for w in ws):
                host.add(name)
                changed = True
            if name not in asm and any(w & (ASM_WORDS | asm) for w in ws):
                asm.add(name)
                changed = True
    return frozenset(device), frozenset(host), frozenset(asm)


_ARCH = "__CUDA_ARCH__"
_DEFINED_ARCH = re.compile(r"defined\s*(?:\(\s*__CUDA_ARCH__\s*\)|__CUDA_ARCH__)$")
_NOT_DEFINED_ARCH = re.compile(r"!\s*(?:\(\s*)?defined\s*(?:\(\s*__CUDA_ARCH__\s*\)|__CUDA_ARCH__)(?:\s*\))?$")
_ARCH_CMP = re.compile(r"__CUDA_ARCH__\s*(>=|>|==)\s*(\d+)[uUlL]*$|(\d+)[uUlL]*\s*(<=|<|==)\s*__CUDA_ARCH__$")


def _strip_parens(e: str) -> str:
    """``((x))`` -> ``x`` (only parentheses that enclose the whole expression)."""
    e = e.strip()
    while e.startswith("(") and e.endswith(")"):
        depth = 0
        for i, c in enumerate(e):
            depth += {"(": 1, ")": -1}.get(c, 0)
            if depth == 0 and i < len(e) - 1:
                return e  # `(a) && (b)`: the first ( closes early
        e = e[1:-1].strip()
    return e


def _arch_condition(name: str, body: str) -> str | None:
    """"device" (true only on the GPU pass), "device-exact" (exactly the GPU pass), "host"
    (exactly the host pass) or None for a condition that does not decide."""
    body = body.strip()
    if name in ("ifdef", "ifndef"):
        word = body.split()[0] if body.split() else ""
        if word == _ARCH:
            return "device-exact" if name == "ifdef" else "host"
        return None
    e = _strip_parens(body)
    if "||" in e:
        return None
    if _NOT_DEFINED_ARCH.match(e):
        return "host"
    if _DEFINED_ARCH.match(e) or e == _ARCH:
        return "device-exact"
    for part in e.split("&&"):
        p = _strip_parens(part)
        if _DEFINED_ARCH.match(p) or p == _ARCH:
            return "device"
        m = _ARCH_CMP.match(p)
        if m:
            op, num = (m.group(1), int(m.group(2))) if m.group(1) else (m.group(4), int(m.group(3)))
            if op in (">", "<") or num > 0:
                return "device"
    return None


def arch_marks(directives: list[Directive]) -> list[tuple[int, bool]]:
    """Change points of "compiled only for the GPU" along the source."""
    stack: list[list[bool]] = []  # [device now, a previous branch was the host pass, ... exactly the GPU pass]
    n_device = 0  # entries of `stack` whose branch is device-only
    marks: list[tuple[int, bool]] = []
    for d in directives:
        if d.name in ("if", "ifdef", "ifndef"):
            c = _arch_condition(d.name, d.body)
            stack.append([c in ("device", "device-exact"), c == "host", c == "device-exact"])
            n_device += stack[-1][0]
        elif d.name in ("elif", "elifdef", "elifndef", "else") and stack:
            top = stack[-1]
            was = top[0]
            c = None if d.name == "else" else _arch_condition({"elif": "if", "elifdef": "ifdef"}.get(d.name, "ifndef"),
                                                            d.body)
            top[0] = top[1] or c in ("device", "device-exact")
            top[1] = top[1] or c == "host"
            top[2] = top[2] or c == "device-exact"
            if top[2] and d.name == "else":
                top[0] = False
            n_device += top[0] - was
        elif d.name == "endif" and stack:
            n_device -= stack.pop()[0]
        else:
            continue
        marks.append((d.end, n_device > 0))
    return marks


_NS_ALIAS = re.compile(r"\bnamespace\s+([A-Za-z_]\w*)\s*=\s*([\w\s:]+?)\s*;")
_USING_NS = re.compile(r"\busing\s+namespace\s+([\w\s:]+?)\s*;")


def std_names(code: str, frames: list[Frame], macros: Mapping[str, list[tuple[bool, str]]]) -> tuple[frozenset, bool]:
    """Qualifiers that may stand for namespace ``std``, and whether ``std`` is ever used.

    Starts from ``std``, ``::`` and reserved names (``std::__1``, ``__gnu_cxx``) and adds, to
    a fixpoint: namespace aliases of them (``namespace q = std;``), object-like macros that
    spell them, and every namespace of the source that contains a ``using`` (``namespace q {
    using std::system; }`` makes ``q::system`` the library's).
    """
    names = {"", "std"}

    def std_like(chain: str) -> bool:
        comps = re.findall(r"[A-Za-z_]\w*", chain)
        return any(c in names or c.startswith("__") or re.match(r"_[A-Z]", c) for c in comps) or chain.strip() == "::"

    for f in frames:
        m = re.match(r"(?:inline\s+)?namespace\s+([\w:\s]+?)\s*$", f.head)
        if f.kind == "ns" and m and re.search(r"\busing\b", code[f.start : f.end]):
            names.update(re.findall(r"[A-Za-z_]\w*", m.group(1)))
    aliases = [(m.group(1), m.group(2)) for m in _NS_ALIAS.finditer(code)]
    aliases += [(name, body) for name, defs in macros.items() for fn, body in defs
                if not fn and re.fullmatch(r"[\w\s:]+", body.strip() or "-")]
    changed = True
    while changed:
        changed = False
        for name, target in aliases:
            if name not in names and std_like(target):
                names.add(name)
                changed = True
    uses = any(std_like(m.group(1)) for m in _USING_NS.finditer(code))
    return frozenset(names), uses
