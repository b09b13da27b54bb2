"""Compile errors as a repair prompt needs them: the candidate's own lines first.

nvcc (EDG front end) reports an error inside a CuTe / CUTLASS header with the header's
location and a *detected during* chain of template instantiations, innermost first, each
``at line N of FILE`` (``at line N`` alone: the diagnostic's own file). The line that the
model can change is the chain's frame in the candidate (``at line 88 of candidate.cu``); the
header line is only context. A raw log puts 40 of these stacks first and the kernel's own
lines last, or cuts them off.

:func:`parse_diagnostics` reads the log into :class:`Diagnostic` records; :func:`digest`
renders them for a prompt: errors located in the candidate first, then header errors with
the candidate frames that instantiated them (innermost and outermost, the header frames
counted, not listed), duplicates merged, within ``max_chars``. :func:`kernel_lines` lists
the candidate lines to excerpt (never a header's line number: ``at line 502 of
.../cute/layout.hpp`` is not kernel line 502). Policy messages (``... at line 12``) are
read the same way when no compiler location is present.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Diagnostic", "Frame", "parse_diagnostics", "digest", "kernel_lines", "numbered_excerpt",
           "CANDIDATE_FILE"]

#: The name the compile stage gives the candidate's source (evaluators/compile/nvcc.py).
CANDIDATE_FILE = "candidate.cu"

_NVCC_RE = re.compile(r"^(?P<file>\S+?)\((?P<line>\d+)\): (?P<sev>(?:catastrophic )?error|warning)(?: #[\w-]+)?: "
                      r"(?P<msg>.*)$")
_GCC_RE = re.compile(r"^(?P<file>[^\s:]+):(?P<line>\d+):(?:\d+:)? (?P<sev>(?:fatal )?error|warning): (?P<msg>.*)$")
_FRAME_RE = re.compile(r"instantiation of (?P<what>\".*?\"|\S+)\s+at line (?P<line>\d+)(?: of (?P<file>\S+))?")
_POLICY_LINE_RE = re.compile(r"\bline (?P<line>\d+)\b(?! of )")
_SUMMARY_RE = re.compile(r"^\d+ errors? detected in the compilation of")
_HEADER_RE = re.compile(r"\.(?:h|hpp|hxx|cuh|inl|inc)$|/include/|/cute/|/cutlass/|^<")


def _candidate_name(diags: list["Diagnostic"], name: str) -> str:
    """``name``, unless the log never mentions it and names exactly one non-header source
    file (a log from a build that called the candidate something else)."""
    files = {d.file.strip('"') for d in diags} | {f.file.strip('"') for d in diags for f in d.frames}
    if any(_same_file(f, name) for f in files):
        return name
    sources = sorted(f for f in files if not _HEADER_RE.search(f))
    return sources[0] if len(sources) == 1 else name


@dataclass(frozen=True)
class Frame:
    """One ``instantiation of "what" at line N of FILE`` entry of a detected-during chain."""

    what: str
    file: str
    line: int


@dataclass(frozen=True)
class Diagnostic:
    """One compiler message: where, how severe, the message, the quoted source and caret,
    and the instantiation chain (innermost first)."""

    file: str
    line: int
    severity: str
    message: str
    quoted: tuple[str, ...] = ()
    frames: tuple[Frame, ...] = field(default_factory=tuple)

    def in_file(self, name: str) -> bool:
        return _same_file(self.file, name)

    def candidate_frames(self, name: str = CANDIDATE_FILE) -> tuple[Frame, ...]:
        return tuple(f for f in self.frames if _same_file(f.file, name))


def _same_file(path: str, name: str) -> bool:
    path = path.strip('"')
    return path == name or path.endswith("/" + name)


def parse_diagnostics(log: str) -> list[Diagnostic]:
    """Every error / warning of an nvcc (or host-compiler) log, with its instantiation chain."""
    out: list[Diagnostic] = []
    lines = (log or "").replace("\r\n", "\n").split("\n")
    i, n = 0, len(lines)
    while i < n:
        m = _NVCC_RE.match(lines[i]) or _GCC_RE.match(lines[i])
        if m is None:
            i += 1
            continue
        file, line, sev, msg = m.group("file"), int(m.group("line")), m.group("sev"), m.group("msg").strip()
        quoted: list[str] = []
        frames: list[Frame] = []
        j = i + 1
        in_chain = False
        while j < n and lines[j].strip() and not (_NVCC_RE.match(lines[j]) or _GCC_RE.match(lines[j])) \
                and not _SUMMARY_RE.match(lines[j]):
            text = lines[j]
            fm = _FRAME_RE.search(text)
            if "detected during" in text:
                in_chain = True
            if fm is not None:
                frames.append(Frame(fm.group("what").strip('"'), fm.group("file") or file, int(fm.group("line"))))
            elif not in_chain and len(quoted) < 2:
                quoted.append(text.rstrip())
            j += 1
        out.append(Diagnostic(file, line, sev, msg, tuple(quoted), tuple(frames)))
        i = j
    return out


def _short(what: str, limit: int = 110) -> str:
    """A template signature without its ``[with ...]`` bindings, trimmed."""
    what = re.sub(r"\s*\[with .*\]$", "", what)
    return what if len(what) <= limit else what[: limit - 3] + "..."


def kernel_lines(text: str, source: str, *, name: str = CANDIDATE_FILE, max_locations: int = 6) -> list[int]:
    """Candidate line numbers an error text points at, most relevant first.

    Compiler messages located in the candidate, then for header messages their innermost
    and outermost candidate frames; if the text has no compiler location at all, policy
    style ``line N`` mentions (but never ``line N of <another file>``). Only lines that exist
    in ``source``.
    """
    n = len(source.splitlines())
    found: list[int] = []

    def add(ln: int) -> None:
        if 1 <= ln <= n and ln not in found:
            found.append(ln)

    diags = parse_diagnostics(text)
    name = _candidate_name(diags, name)
    errors = [d for d in diags if "error" in d.severity] or diags
    for d in errors:
        if d.in_file(name):
            add(d.line)
    for d in errors:
        if not d.in_file(name):
            cf = d.candidate_frames(name)
            if cf:
                add(cf[0].line)
                add(cf[-1].line)
    if not diags:
        for m in _POLICY_LINE_RE.finditer(text or ""):
            add(int(m.group("line")))
    return found[:max_locations]


def numbered_excerpt(source: str, lines: list[int], context: int = 2) -> str:
    """The source around ``lines``, numbered, the pointed-at lines marked ``>>``; windows that
    touch are merged, gaps shown as ``...``."""
    src = source.splitlines()
    want = sorted({i for ln in lines for i in range(max(1, ln - context), min(len(src), ln + context) + 1)})
    runs: list[list[int]] = []
    for i in want:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return "\n...\n".join("\n".join(f"{'>>' if i in lines else '  '} {i:4d} | {src[i - 1]}" for i in run)
                          for run in runs)


def digest(text: str, source: str, *, name: str = CANDIDATE_FILE, max_chars: int = 3000) -> str:
    """A compile log for a repair prompt (see module docstring); the text itself when it
    holds no compiler diagnostic (policy and correctness messages), trimmed to ``max_chars``."""
    diags = parse_diagnostics(text)
    name = _candidate_name(diags, name)
    if not diags:
        t = (text or "").strip()
        return t if len(t) <= max_chars else t[: max_chars - 20].rstrip() + "\n[... trimmed ...]"
    errors = [d for d in diags if "error" in d.severity]
    shown_diags = errors or diags
    direct = [d for d in shown_diags if d.in_file(name)]
    via = [d for d in shown_diags if not d.in_file(name) and d.candidate_frames(name)]
    other = [d for d in shown_diags if not d.in_file(name) and not d.candidate_frames(name)]
    n_err = len(errors)
    lines_hit = kernel_lines(text, source, name=name)
    head = f"{n_err} error{'s' if n_err != 1 else ''}" if errors else f"{len(diags)} warning(s)"
    if lines_hit:
        head += f"; in your kernel at line{'s' if len(lines_hit) > 1 else ''} {', '.join(map(str, lines_hit))}"
    parts = [head + "."]
    seen: set[tuple[str, tuple[int, ...]]] = set()

    def block(d: Diagnostic) -> str | None:
        cf = d.candidate_frames(name)
        key = (d.message, (d.line,) if d.in_file(name) else tuple(f.line for f in cf))
        if key in seen:
            return None
        seen.add(key)
        if d.in_file(name):
            out = [f"{name}({d.line}): {d.severity}: {d.message}"] + [f"  {q.strip()}" for q in d.quoted[:1]]
            if cf:
                out.append(f"  (instantiated from {name} line {cf[-1].line})")
            return "\n".join(out)
        out = [f"{d.severity}: {d.message}", f"  raised inside {d.file}({d.line}), a library header"
               + (f", at:\n    {d.quoted[0].strip()}" if d.quoted else ""), "  your kernel's frames of the instantiation:"]
        picks = [cf[0]] if len(cf) == 1 else [cf[0], cf[-1]]
        for k, f in enumerate(picks):
            role = "innermost" if k == 0 and len(picks) > 1 else ("outermost" if len(picks) > 1 else "")
            out.append(f"  {name}({f.line}){' [' + role + ']' if role else ''}: {_short(f.what)}")
        hidden = len(d.frames) - len(picks)
        if hidden > 0:
            out.append(f"  ({hidden} more frame{'s' if hidden != 1 else ''} of the chain omitted: inside headers "
                       f"or between the two above)")
        return "\n".join(out)

    for d in direct + via:
        b = block(d)
        if b is not None:
            parts.append(b)
    for d in other:
        key = (d.message, ())
        if key not in seen:
            seen.add(key)
            parts.append(f"{d.file}({d.line}): {d.severity}: {d.message}")
    dup = len(shown_diags) - len(seen)
    if dup > 0:
        parts.append(f"({dup} more message{'s' if dup != 1 else ''} repeating the ones above omitted)")
    out = "\n\n".join(parts)
    if len(out) > max_chars:
        out = out[: max_chars - 20].rstrip() + "\n[... trimmed ...]"
    return out
