"""The structural rules: what the brace scanner's scopes tell (state, asm, linkage, entry point).

- ``no-global-state``: mutable state that survives between calls.
- ``no-host-asm``: inline asm that the CPU can run. A ``__host__ __device__`` function's
  host side is host code: its asm must sit under ``#ifdef __CUDA_ARCH__`` (or a spelling the
  reader recognises). A macro that expands to asm counts as asm where it is used; asm that
  issues a system call is refused even in device code.
- ``no-linker-tricks``: ways to bind a harmless-looking declaration to another symbol or to
  run code at load time: asm labels (``int run(const char*) __asm__("system")``),
  ``alias``/``weakref``/``ifunc``/``symver``/``constructor``/``destructor`` attributes, and
  pragmas off the allowlist (``#pragma redefine_extname run system``, ``_Pragma(...)``).
- ``one-entry-point``: exactly one ``evo_launch`` with the ABI signature.
"""

from __future__ import annotations

import re

from evaluators.policy.base import Violation
from evaluators.policy.reader import (
    ASM_WORDS,
    CONST_MACROS,
    FUNC_TAIL,
    ParsedSource,
    collapse_braces,
    matching_open,
    normalize_head,
    prev_nonspace,
    top_level_index,
)

__all__ = ["check_global_state", "check_host_asm", "check_linker_tricks", "check_entry_point", "pragma_allowed"]


# ---------------------------------------------------------------------------------------------
# no-global-state

def _is_const_decl(decl: str) -> bool:
    """Whether a declaration (text before its initializer) declares an immutable object."""
    words = re.findall(r"[A-Za-z_]\w*|\*", decl)
    wordset = set(words)
    if wordset & ({"constexpr", "__constant__", "__shared__", "consteval", "constinit"} | CONST_MACROS):
        return "constinit" not in wordset or "const" in wordset
    if "const" not in wordset:
        return False
    # `const T* p` is a mutable pointer; `T* const p` / `const T* const p` are not
    if "*" in words:
        last_star = len(words) - 1 - words[::-1].index("*")
        return "const" in words[last_star + 1 :]
    return True


_LIT = r"(?:[-+]?(?:\d|\.\d)[\w.']*|nullptr|NULL|true|false|\"\s*\"|'\s*')"
_LITERAL_ARGS = re.compile(r"\(\s*(?:" + _LIT + r")?\s*(?:,\s*" + _LIT + r")*\s*\)")


def _variable_in(stmt: str) -> tuple[str, str] | None:
    """If a namespace/class-scope statement declares a variable: (declaration text, name)."""
    s = collapse_braces(stmt)
    s = re.sub(r"^\s*(?:(?:public|private|protected)\s*:\s*)+", "", s)
    s = normalize_head(s)
    s = re.sub(r'\bextern\s*"\s*"', " extern ", s).strip()
    if not s:
        return None
    first = s.split(None, 1)[0]
    if first in ("using", "typedef", "static_assert", "friend", "namespace", "template", "asm",
                 "__asm__", "__asm", "return"):
        return None
    # type declarations / definitions: `struct X;`, `struct X : B<Y...> {}`, `enum class E {}`;
    # a variable only if a declarator follows the body (`struct {...} g;`) or the name
    if re.match(r"(?:struct|class|union|enum)\b", s) and not FUNC_TAIL.search(s.split("{}")[0]):
        if "{}" in s:
            tail = s[s.rindex("{}") + 2 :]
            if not re.search(r"[A-Za-z_]", tail):
                return None
            name_m = re.search(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*$", tail.split("=")[0].strip())
            return s.split("=")[0], (name_m.group(1) if name_m else "?")
        body = re.sub(r"<[^<>]*>", "", re.sub(r"<[^<>]*>", "", s))  # drop (two levels of) template args
        if len(re.findall(r"[A-Za-z_]\w*", body.split("=")[0].split(":")[0])) <= 2:
            return None
    eq = top_level_index(s, "=")
    par = top_level_index(s, "(")
    if par >= 0 and (eq < 0 or par < eq):
        after = s[par + 1 :].lstrip()
        m = _LITERAL_ARGS.match(s[par:])
        if not (after.startswith("*") or after.startswith("&") or (m and m.group(0).strip("() \t") != "")):
            return None  # a function declaration
        decl = s[:par] if not (after.startswith("*") or after.startswith("&")) else s
    else:
        decl = s[:eq] if eq >= 0 else s
    decl_c = re.sub(r"\{\}", " ", decl)
    decl_c = re.sub(r"\[[^\]]*\]", " ", decl_c)
    idents = re.findall(r"[A-Za-z_]\w*", decl_c)
    if len([w for w in idents if w not in ("extern", "static", "inline", "volatile", "thread_local")]) < 2:
        return None  # a lone macro invocation or label, not a declaration
    name_m = re.search(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*(?:\{\})?\s*$", re.sub(r"\)\s*$", "", decl.strip()))
    name = name_m.group(1) if name_m else "?"
    return decl, name


def check_global_state(p: ParsedSource) -> list[Violation]:
    out = []
    for kind, offset, stmt in p.statements:
        if kind == "ns":
            var = _variable_in(stmt)
            if var is None:
                continue
            decl, name = var
            if _is_const_decl(decl):
                continue
            what = "__device__ variable" if re.search(r"\b__device__\b", decl) else (
                "__managed__ variable" if "__managed__" in decl else "namespace-scope variable")
            if re.search(r"\b(thread_local|__thread)\b", decl):
                what = "thread_local variable"
            first = re.search(r"\S", stmt)
            line = p.line(offset + (first.start() if first else 0))
            out.append(Violation("no-global-state", line,
                                 f"mutable {what} `{name}` survives between calls; make it constexpr/const or "
                                 f"compute it inside evo_launch"))
        elif kind in ("class", "func", "block"):
            body = collapse_braces(stmt)
            m = re.search(r"\b(static|thread_local)\b", body)
            if not m:
                continue
            if kind == "class":
                var = _variable_in(stmt)
                if var is None:
                    continue
                decl, name = var
            else:
                rest = body[m.start() :]
                eq = top_level_index(rest, "=")
                decl = rest[:eq] if eq >= 0 else rest
                par = top_level_index(decl, "(")
                decl = decl[:par] if par >= 0 else decl
                nm = re.search(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*(?:\{\})?\s*$", decl.strip())
                name = nm.group(1) if nm else "?"
            if _is_const_decl(decl):
                continue
            ms = re.search(r"\b(static|thread_local)\b", stmt)
            line = p.line(offset + (ms.start() if ms else 0))
            out.append(Violation("no-global-state", line,
                                 f"mutable static `{name}` survives between calls; make it constexpr/const or "
                                 f"a plain local"))
    # `#define CACHE static int hits = 0;` hides the keyword from the statement scanner
    for m in re.finditer(r"\b(static|thread_local)\b([^;{}()#]*?)(=|;)", p.macro_code):
        if not _is_const_decl(m.group(0)[:-1]):
            out.append(Violation("no-global-state", p.line(m.start()),
                                 "mutable static declared inside a #define survives between calls"))
    return sorted(out, key=lambda v: v.line)


# ---------------------------------------------------------------------------------------------
# asm sites: no-host-asm and asm labels

_STATEMENT_WORDS = frozenset({"if", "while", "for", "switch", "constexpr"})
_SYSCALL_ASM = re.compile(r"\bsyscall\b|\bsysenter\b|\bint\s*\$?0x80\b|\bsvc\s+#?0\b")
_DEFINE_HEAD = re.compile(r"[ \t]*(?:#|%:)[ \t]*define[ \t]+\w+(?:\([^)]*\))?")


def _asm_sites(p: ParsedSource, view: str) -> list[tuple[int, str]]:
    """Offsets of ``asm`` keywords and of asm macros (a macro whose body contains asm)."""
    index = p.idents(view)
    sites = [(off, w) for w in ASM_WORDS | p.asm_macros for off in index.get(w, ())]
    if view is p.macro_code:  # `#define NAME ...` names an asm macro; it does not use one
        sites = [(off, w) for off, w in sites if not _defines(view, off)]
    return sorted(sites)


_DEFINE_NAME = re.compile(r"[ \t]*(?:#|%:)[ \t]*define[ \t]+")


def _defines(view: str, off: int) -> bool:
    """Whether the identifier at ``off`` is the name a ``#define`` line defines."""
    m = _DEFINE_NAME.match(view, view.rfind("\n", 0, off) + 1)
    return bool(m) and m.end() == off


def _word_before(s: str, j: int) -> str:
    m = re.search(r"([A-Za-z_]\w*)$", s[max(0, j - 64) : j + 1])
    return m.group(1) if m else ""


def _is_label(view: str, off: int, in_define: bool) -> bool:
    """Whether the asm at ``off`` follows a declarator (``int f(int) asm("x")``, a label)
    rather than starting a statement (``if (c) asm volatile(...)``)."""
    j = prev_nonspace(view, off)
    if in_define:
        line = view.rfind("\n", 0, off) + 1
        head = _DEFINE_HEAD.match(view, line)
        if head and j < head.end():
            return False  # the first token of a macro body: the macro's uses decide
    if j < 0 or view[j] in ";{}:,(":
        return False
    if view[j] == ")":
        k = matching_open(view, j)
        return k < 0 or _word_before(view, prev_nonspace(view, k)) not in _STATEMENT_WORDS
    if view[j].isalnum() or view[j] == "_":
        return _word_before(view, j) not in ("else", "do")
    return view[j] in "]\"'"


def _asm_text(p: ParsedSource, view: str, off: int, word: str) -> str:
    """The string literals of an asm statement, concatenated (``"sys" "call"`` -> ``syscall``)."""
    m = re.compile(re.escape(word) + r"(?:\s+(?:volatile|__volatile__|inline|goto))*\s*\(").match(view, off)
    if not m:
        return ""
    depth, j = 1, m.end()
    limit = min(len(view), j + 4000)
    while j < limit and depth:
        depth += {"(": 1, ")": -1}.get(view[j], 0)
        j += 1
    return "".join(re.findall(r'"((?:[^"\\\n]|\\.)*)"', p.nocomment[m.end() : j]))


def check_host_asm(p: ParsedSource) -> list[Violation]:
    out = []
    for view, in_define in ((p.code, False), (p.macro_code, True)):
        for off, word in _asm_sites(p, view):
            line = p.line(off)
            if word in ASM_WORDS and _SYSCALL_ASM.search(_asm_text(p, view, off, word)):
                out.append(Violation("no-host-asm", line, "inline asm that issues a system call"))
                continue
            if in_define or _is_label(view, off, False):
                continue  # macro bodies are judged where they are used; labels by no-linker-tricks
            via = "" if word in ASM_WORDS else f" (through macro `{word}`)"
            fn = p.function_at(off)
            if fn is None:
                out.append(Violation("no-host-asm", line, f"file-scope inline asm{via}; asm belongs inside "
                                                          "__device__/__global__ functions"))
            elif not fn.device:
                out.append(Violation("no-host-asm", line, f"inline asm in a host function{via}; asm belongs inside "
                                                          "__device__/__global__ functions"))
            elif fn.host and not p.device_only(off):
                out.append(Violation("no-host-asm", line,
                                     f"inline asm in a __host__ __device__ function{via}: its host side runs on the "
                                     "CPU; make the function __device__ or put the asm under #ifdef __CUDA_ARCH__"))
    return out


# ---------------------------------------------------------------------------------------------
# no-linker-tricks

_TRICK_WORDS = frozenset({w for base in ("alias", "weakref", "ifunc", "symver", "constructor", "destructor")
                          for w in (base, f"__{base}__")})
_DISTINCTIVE_TRICKS = frozenset(w for w in _TRICK_WORDS if "alias" not in w and "structor" not in w)
_ATTRIBUTE_WORDS = frozenset({"__attribute__", "__attribute", "__declspec"})

#: Pragmas a candidate may use (first words); anything else could rename symbols
#: (``redefine_extname``, ``weak``) or change how the compiler reads the rest.
_PRAGMA_OK = re.compile(
    r"\s*(?:unroll\b|nounroll\b|once\s*$|(?:nv_)?diag_(?:suppress|warning|default|error|once)\b|nv_diagnostic\b|"
    r"nv_exec_check_disable\s*$|hd_warning_disable\s*$|GCC\s+(?:diagnostic|unroll|ivdep)\b|"
    r"clang\s+(?:diagnostic|loop)\b|message\b|pack\b|STDC\s+FP_CONTRACT\b)")


def pragma_allowed(text: str) -> bool:
    """Whether a pragma's text (after ``#pragma`` / inside ``_Pragma("...")``) is allowed."""
    return bool(_PRAGMA_OK.match(text))


def _trick_macros(p: ParsedSource) -> frozenset[str]:
    out: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, bodies in p.macros.items():
            if name not in out and any(set(re.findall(r"[A-Za-z_]\w*", b)) & (_TRICK_WORDS | out) for b in bodies):
                out.add(name)
                changed = True
    return frozenset(out)


def _in_attribute(view: str, off: int, attribute_macros: frozenset[str]) -> bool:
    """Whether ``off`` is inside ``__attribute__((...))``, ``[[...]]``, ``__declspec(...)`` or any
    ``((...))`` (an attribute spelled through a macro)."""
    depth = 0
    for k in range(off - 1, max(-1, off - 600), -1):
        c = view[k]
        if c in ")]":
            depth += 1
        elif c in "([":
            if depth:
                depth -= 1
                continue
            if c == "[" and k > 0 and view[k - 1] == "[":
                return True
            if c == "(":
                j = prev_nonspace(view, k)
                if j >= 0 and view[j] == "(":
                    return True
                if _word_before(view, j) in _ATTRIBUTE_WORDS | attribute_macros:
                    return True
        elif c in ";{}":
            return False
    return False


def _unescape(s: str) -> str:
    return re.sub(r"\\(.)", r"\1", s)


def check_linker_tricks(p: ParsedSource) -> list[Violation]:
    out = []
    rule = "no-linker-tricks"
    for view, in_define in ((p.code, False), (p.macro_code, True)):
        for off, word in _asm_sites(p, view):
            if _is_label(view, off, in_define):
                out.append(Violation(rule, p.line(off),
                                     f"asm label (`declaration {word}(\"name\")`) binds a declaration to another "
                                     "symbol; declare and call functions by their own names"))
    tricks = _trick_macros(p)
    attr_macros = frozenset(n for n, bodies in p.macros.items() if any("__attribute__" in b for b in bodies))
    for view, in_define in ((p.code, False), (p.macro_code, True)):
        index = p.idents(view)
        for word in _TRICK_WORDS | tricks:
            for off in index.get(word, ()):
                if in_define and _defines(view, off):
                    continue
                j = prev_nonspace(view, off)
                if j >= 0 and (view[j] == "." or (view[j] == ">" and view[j - 1] == "-")):
                    continue
                nxt = re.compile(r"\s*\(").match(view, off + len(word))
                if (_in_attribute(view, off, attr_macros) or (nxt and word in _TRICK_WORDS)
                        or (in_define and word in _DISTINCTIVE_TRICKS)):
                    out.append(Violation(rule, p.line(off),
                                         f"attribute `{word}` binds a symbol to another or runs code at load time"))
        for word in ("_Pragma", "__pragma"):
            for off in index.get(word, ()):
                m = re.compile(r'\s*\(\s*(?:u8|u|U|L)?"((?:[^"\\\n]|\\.)*)"\s*\)').match(p.nocomment, off + len(word))
                if not m:
                    out.append(Violation(rule, p.line(off), f"`{word}` with a computed argument; write `#pragma` lines"))
                elif not pragma_allowed(_unescape(m.group(1))):
                    out.append(Violation(rule, p.line(off), f"`{word}(\"{m.group(1)[:40]}\")` is not an allowed pragma"))
    for d in p.directives:
        if d.name == "pragma" and not pragma_allowed(d.body):
            what = " (it renames symbols)" if re.match(r"\s*(?:redefine_extname|weak)\b", d.body) else ""
            out.append(Violation(rule, d.line, f"#pragma `{d.body[:40]}` is not on the allowlist{what}"))
    return sorted(set(out), key=lambda v: (v.line, v.message))


# ---------------------------------------------------------------------------------------------
# one-entry-point

_EXPECTED_PARAMS = ("const EvoTensor*", "int", "EvoTensor*", "int", "const double*", "int", "cudaStream_t")
_TYPE_WORDS = {"const", "volatile", "struct", "unsigned", "signed", "long", "short"}


def _normalize_param(param: str) -> str:
    """Canonical spelling of a parameter's type: names, top-level const and restrict dropped."""
    param = param.split("=", 1)[0]
    param = re.sub(r"\b(__restrict__|__restrict|restrict|struct)\b", " ", param)
    param = re.sub(r"(?:(?<=\s)|^)::\s*(?=[A-Za-z_])", "", param.strip())
    param = re.sub(r"([A-Za-z_]\w*)?\s*\[[^\]]*\]\s*$", lambda m: "* " + (m.group(1) or ""), param)
    toks = re.findall(r"[A-Za-z_]\w*|\*|&", param)
    if len(toks) >= 2 and re.fullmatch(r"[A-Za-z_]\w*", toks[-1]) and toks[-1] not in _TYPE_WORDS:
        if any(t not in _TYPE_WORDS for t in toks[:-1]):  # a type precedes it: it is the name
            toks = toks[:-1]
    pieces: list[list[str]] = [[]]
    seps: list[str] = []
    for t in toks:
        if t in ("*", "&"):
            seps.append(t)
            pieces.append([])
        else:
            pieces[-1].append(t)

    def fmt(piece: list[str]) -> str:
        words = [w for w in piece if w not in ("const", "volatile")]
        quals = [w for w in ("const", "volatile") if w in piece]
        return " ".join(quals + words)

    # qualifiers after the last * or & apply to the parameter itself: not part of the signature
    out = "".join(fmt(pc) + sep for pc, sep in zip(pieces[:-1], seps))
    top = [w for w in pieces[-1] if w not in ("const", "volatile")]
    return out + " ".join(top)


def _split_params(head: str) -> tuple[str, list[str]] | None:
    m = re.search(r"\bevo_launch\s*\(", head)
    if not m:
        return None
    depth, j = 1, m.end()
    while j < len(head) and depth:
        if head[j] == "(":
            depth += 1
        elif head[j] == ")":
            depth -= 1
        j += 1
    inner = head[m.end() : j - 1]
    params, depth, cur = [], 0, []
    for ch in inner:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            params.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        params.append("".join(cur))
    return head[: m.start()], params


def check_entry_point(p: ParsedSource) -> list[Violation]:
    out = []
    defs = [f for f in p.frames if f.kind == "func" and re.search(r"\bevo_launch\s*\(", f.head)
            and re.search(r"\bevo_launch\s*\(", normalize_head(f.head))]
    includes_abi = any(d.name == "include" and re.search(r"[<\"]evo_abi\.h[>\"]", d.body) for d in p.directives)
    for d in p.directives:
        if d.name in ("define", "undef") and re.match(r"evo_launch\b", d.body):
            out.append(Violation("one-entry-point", d.line, f"#{d.name} of evo_launch hides the entry point"))
    if not defs:
        out.append(Violation("one-entry-point", 1, "no definition of `evo_launch` (include \"evo_abi.h\" and define it)"))
        return out
    defs.sort(key=lambda f: f.start)
    for extra in defs[1:]:
        out.append(Violation("one-entry-point", p.line(extra.head_start),
                             "a second definition of `evo_launch`; exactly one is allowed"))
    f = defs[0]
    line = p.line(f.head_start)
    split = _split_params(normalize_head(f.head))
    if split is None:
        return out
    ret, params = split
    got = tuple(_normalize_param(x) for x in params)
    if got != _EXPECTED_PARAMS:
        out.append(Violation("one-entry-point", line,
                             f"evo_launch parameters are ({', '.join(got)}); the ABI is "
                             f"({', '.join(_EXPECTED_PARAMS)})"))
    ret_words = [w for w in re.findall(r"[A-Za-z_]\w*", re.sub(r'"[^"]*"', " ", ret))
                 if w not in ("EVO_EXPORT", "extern", "__host__")]
    if re.match(r"\s*template\b", f.head):
        ret_words = ["template<...>", *ret_words]
    if ret_words != ["int"]:
        out.append(Violation("one-entry-point", line,
                             f"evo_launch must be declared `EVO_EXPORT int evo_launch(...)`, not `{' '.join(ret_words)}`"))
    if not (includes_abi or f.c_linkage or "EVO_EXPORT" in ret or re.search(r'\bextern\s*"', ret)):
        out.append(Violation("one-entry-point", line,
                             "evo_launch needs C linkage: include \"evo_abi.h\" or use EVO_EXPORT"))
    return out

