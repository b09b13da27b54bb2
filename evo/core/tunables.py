"""Tunable parameters and constraints declared inside a kernel source.

A kernel declares what the tuner (Optuna) and the offline ``knobs`` mutator may change with
comment annotations, and keeps a compile-time default for each so that the source builds on
its own::

    // @tunable BLOCK = 256 in {128, 256, 512, 1024}
    // @tunable LAYOUT = ROW in {ROW, COL}
    // @constraint BLOCK * VEC <= 4096
    #ifndef BLOCK
    #define BLOCK 256
    #endif

Values are integers or C identifiers and always travel as strings (they become ``-DNAME=VALUE``
compiler flags and part of the candidate's identity, see ``evo.core.records.canonical_params``).

Constraints are C-like integer expressions over the tunables (and over integer constants the
source defines with a plain ``#define NAME 123`` line, e.g. the task-config block of a seed):
``+ - * / %``, comparisons, ``&& || !`` and parentheses, with C semantics (``/`` truncates
toward zero, ``%`` takes the sign of the dividend, comparisons and logic give 0 or 1). They
are checked before compiling; a violated one prunes the candidate without spending a compile.
Expressions are parsed with :mod:`ast` and evaluated by walking a whitelist of node types;
nothing is ever passed to ``eval``.
"""

from __future__ import annotations

import ast
import logging
import re
from dataclasses import dataclass
from typing import Callable, Mapping

__all__ = [
    "Tunable",
    "Constraint",
    "TunableError",
    "parse_tunables",
    "parse_constraints",
    "parse_int_constants",
    "resolve_params",
    "violated_constraints",
    "evaluate_constraint",
    "check_tunable_defaults",
    "constraint_checker",
]

log = logging.getLogger(__name__)

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_VALUE = r"-?[0-9]+|[A-Za-z_][A-Za-z0-9_]*"
_TUNABLE_RE = re.compile(
    rf"^\s*//\s*@tunable\s+(?P<name>{_IDENT})\s*=\s*(?P<default>{_VALUE})\s+in\s*"
    r"\{(?P<choices>[^}]*)\}\s*$"
)
_TUNABLE_LOOSE_RE = re.compile(r"^\s*//\s*@tunable\b")
_CONSTRAINT_RE = re.compile(r"^\s*//\s*@constraint\s+(?P<expr>.+?)\s*$")
_VALUE_RE = re.compile(rf"^(?:{_VALUE})$")
_INT_RE = re.compile(r"^-?[0-9]+$")
_DEFINE_INT_RE = re.compile(rf"^\s*#\s*define\s+(?P<name>{_IDENT})\s+\(?(?P<value>-?[0-9]+)\)?\s*(?://.*)?$")
_IFNDEF_RE = re.compile(rf"^\s*#\s*ifndef\s+(?P<name>{_IDENT})\s*$")
_DEFINE_RE = re.compile(rf"^\s*#\s*define\s+(?P<name>{_IDENT})(?:\s+(?P<value>.*?))?\s*$")

#: Longest constraint accepted; a guard against pathological inputs, not a style rule.
MAX_CONSTRAINT_CHARS = 500


class TunableError(ValueError):
    """A malformed annotation, an unknown tunable, or a value outside its declared set."""


@dataclass(frozen=True)
class Tunable:
    """One ``// @tunable NAME = DEFAULT in {a, b, c}`` declaration (values as strings)."""

    name: str
    default: str
    choices: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.default not in self.choices:
            raise TunableError(
                f"tunable {self.name}: default {self.default!r} is not one of its choices "
                f"{{{', '.join(self.choices)}}}; add it to the set or change the default"
            )


@dataclass(frozen=True)
class Constraint:
    """One ``// @constraint EXPR`` declaration; ``line`` is 1-based in the source."""

    expr: str
    line: int


def parse_tunables(source: str) -> tuple[Tunable, ...]:
    """All tunables declared in ``source``, in order of appearance.

    Raises :class:`TunableError` for a malformed ``@tunable`` line, a duplicate name, an
    empty or duplicated choice set, or a default outside the set.
    """
    out: list[Tunable] = []
    seen: set[str] = set()
    for lineno, line in enumerate(source.splitlines(), 1):
        if not _TUNABLE_LOOSE_RE.match(line):
            continue
        m = _TUNABLE_RE.match(line)
        if not m:
            raise TunableError(
                f"line {lineno}: malformed @tunable annotation {line.strip()!r}; expected "
                "'// @tunable NAME = DEFAULT in {a, b, c}' with integer or identifier values"
            )
        name = m.group("name")
        choices = tuple(c.strip() for c in m.group("choices").split(",") if c.strip())
        if not choices:
            raise TunableError(f"line {lineno}: tunable {name} has an empty choice set")
        bad = [c for c in choices if not _VALUE_RE.match(c)]
        if bad:
            raise TunableError(
                f"line {lineno}: tunable {name} has invalid choices {bad}; values must be "
                "integers or C identifiers"
            )
        if len(set(choices)) != len(choices):
            raise TunableError(f"line {lineno}: tunable {name} lists a choice twice: {choices}")
        if name in seen:
            raise TunableError(f"line {lineno}: tunable {name} is declared twice")
        seen.add(name)
        out.append(Tunable(name=name, default=m.group("default"), choices=choices))
    return tuple(out)


def parse_constraints(source: str) -> tuple[Constraint, ...]:
    """All ``@constraint`` lines in ``source``; each is syntax-checked (TunableError if bad)."""
    out: list[Constraint] = []
    for lineno, line in enumerate(source.splitlines(), 1):
        m = _CONSTRAINT_RE.match(line)
        if m:
            expr = m.group("expr")
            _compile_expr(expr, lineno)  # syntax and whitelist check now, not at tuning time
            out.append(Constraint(expr=expr, line=lineno))
    return tuple(out)


def parse_int_constants(source: str) -> dict[str, int]:
    """Integer macros the source defines (``#define NAME 123``), usable in constraints.

    The first definition wins, as in the preprocessor when later ones sit in ``#ifndef``
    guards (a seed's task-config block comes before the template's guarded fallbacks); a
    tunable's guarded default is overridden by the candidate's value in
    :func:`violated_constraints`.
    """
    consts: dict[str, int] = {}
    for line in source.splitlines():
        m = _DEFINE_INT_RE.match(line)
        if m:
            consts.setdefault(m.group("name"), int(m.group("value")))
    return consts


def resolve_params(source: str, params: Mapping[str, object] | None) -> dict[str, str]:
    """Every tunable of ``source`` with its value: ``params`` where given, else the default.

    Values are compared as strings (``4`` and ``"4"`` are the same). An unknown name or a
    value outside the declared set raises :class:`TunableError` (a ``ValueError``) naming the
    tunable and its allowed values.
    """
    tunables = {t.name: t for t in parse_tunables(source)}
    given = dict(params or {})
    unknown = sorted(set(given) - set(tunables))
    if unknown:
        raise TunableError(
            f"unknown tunable(s) {unknown}; this source declares "
            f"{sorted(tunables) if tunables else 'no tunables'}"
        )
    out: dict[str, str] = {}
    for name, t in tunables.items():
        if name in given:
            value = _as_str(given[name])
            if value not in t.choices:
                raise TunableError(
                    f"tunable {name} = {value!r} is not allowed; choose one of "
                    f"{{{', '.join(t.choices)}}}"
                )
            out[name] = value
        else:
            out[name] = t.default
    return out


def violated_constraints(source: str, params: Mapping[str, object] | None = None) -> list[str]:
    """The constraints of ``source`` that do not hold for ``params`` (defaults filled in).

    Each entry reads ``"line N: EXPR"``; an expression that cannot be evaluated for these
    values (division by zero, a name that is neither a tunable nor an integer ``#define``,
    an identifier-valued tunable used arithmetically) counts as violated, with the reason.
    """
    values: dict[str, int | str] = dict(parse_int_constants(source))
    for name, value in resolve_params(source, params).items():
        values[name] = int(value) if _INT_RE.match(value) else value
    out = []
    for c in parse_constraints(source):
        try:
            ok = evaluate_constraint(c.expr, values)
        except TunableError as exc:
            out.append(f"line {c.line}: {c.expr} (cannot evaluate: {exc})")
            continue
        if not ok:
            out.append(f"line {c.line}: {c.expr}")
    return out


def constraint_checker(source: str) -> Callable[[Mapping[str, object]], bool]:
    """``ok(values)``: does a full assignment of ``source``'s tunables satisfy every
    ``@constraint``? Parsed and compiled once, for callers that check many points (the
    tuning sampler, enumerating a space); an expression that cannot be evaluated counts as
    violated, as in :func:`violated_constraints`."""
    consts = parse_int_constants(source)
    trees = [_compile_expr(c.expr, c.line) for c in parse_constraints(source)]

    def ok(values: Mapping[str, object]) -> bool:
        env: dict[str, int | str] = dict(consts)
        for name, value in values.items():
            v = _as_str(value)
            env[name] = int(v) if _INT_RE.match(v) else v
        try:
            return all(_Evaluator(env).visit(tree) for tree in trees)
        except TunableError:
            return False

    return ok


def evaluate_constraint(expr: str, values: Mapping[str, int | str]) -> int:
    """Value of a C-like integer expression (0 = false); TunableError if it cannot be evaluated."""
    return _Evaluator(values).visit(_compile_expr(expr, 0))


def check_tunable_defaults(source: str) -> list[str]:
    """Problems with the ``#ifndef NAME / #define NAME DEFAULT / #endif`` guard of each tunable.

    Returns human-readable messages (empty when consistent): a tunable without a guard, or
    whose guarded default differs from the annotation's default.
    """
    lines = source.splitlines()
    guarded: dict[str, str] = {}
    for i, line in enumerate(lines):
        m = _IFNDEF_RE.match(line)
        if not m or i + 1 >= len(lines):
            continue
        d = _DEFINE_RE.match(lines[i + 1])
        if d and d.group("name") == m.group("name"):
            guarded[m.group("name")] = (d.group("value") or "").split("//")[0].strip()
    problems = []
    for t in parse_tunables(source):
        if t.name not in guarded:
            problems.append(
                f"tunable {t.name} has no '#ifndef {t.name} / #define {t.name} {t.default} / "
                "#endif' block; add one so the source compiles without -D flags"
            )
        elif guarded[t.name] != t.default:
            problems.append(
                f"tunable {t.name}: annotation default {t.default!r} differs from the "
                f"#ifndef default {guarded[t.name]!r}"
            )
    return problems


# --------------------------------------------------------------------------- internals


def _as_str(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


_C_TOKEN_RE = re.compile(r"\s*(?:(?P<num>[0-9]+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>&&|\|\||==|!=|<=|>=|[-+*/%<>()!]))")


def _translate(expr: str, lineno: int) -> str:
    """C tokens -> Python tokens with the same precedence.

    ``&&``/``||`` become ``and``/``or``; ``!`` becomes ``~`` (a unary operator that binds as
    tightly as C's ``!``, which Python's ``not`` does not) and the evaluator gives ``~`` the
    meaning of logical not. C's own ``~`` is not part of the language, so no ambiguity.
    """
    if len(expr) > MAX_CONSTRAINT_CHARS:
        raise TunableError(f"line {lineno}: constraint longer than {MAX_CONSTRAINT_CHARS} chars")
    pos, out = 0, []
    while pos < len(expr):
        if expr[pos:].strip() == "":
            break
        m = _C_TOKEN_RE.match(expr, pos)
        if not m or m.end() == pos:
            raise TunableError(
                f"line {lineno}: constraint {expr!r}: unexpected text at "
                f"{expr[pos:].strip()[:20]!r}; allowed: integers, tunable names, "
                "+ - * / % == != < <= > >= && || ! ( )"
            )
        pos = m.end()
        tok = m.group("num") or m.group("name") or m.group("op")
        if m.group("name") in {"and", "or", "not", "if", "else", "lambda", "in", "is"}:
            raise TunableError(f"line {lineno}: constraint {expr!r}: {tok!r} is not C syntax")
        out.append({"&&": " and ", "||": " or ", "!": " ~ "}.get(tok, tok))
    return " ".join(out).strip()


_ALLOWED_NODES = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Name, ast.Load,
    ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Mod, ast.USub, ast.UAdd,
    ast.Invert, ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE,
)


def _compile_expr(expr: str, lineno: int) -> ast.Expression:
    text = _translate(expr, lineno)
    if not text.strip():
        raise TunableError(f"line {lineno}: empty @constraint")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise TunableError(f"line {lineno}: constraint {expr!r} is not a valid expression ({exc.msg})") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            raise TunableError(
                f"line {lineno}: constraint {expr!r} uses {type(node).__name__}, which is not allowed"
            )
        if isinstance(node, ast.Constant) and (type(node.value) is not int):
            raise TunableError(f"line {lineno}: constraint {expr!r}: only integer literals are allowed")
        if isinstance(node, ast.Compare) and len(node.ops) > 1:
            raise TunableError(
                f"line {lineno}: constraint {expr!r} chains comparisons; C would evaluate them "
                "left to right as 0/1 values, which is almost never meant: add parentheses"
            )
    return tree


class _Evaluator:
    """Walks a whitelisted tree with C integer semantics."""

    def __init__(self, values: Mapping[str, int | str]):
        self.values = values

    def visit(self, node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return self.visit(node.body)
        if isinstance(node, ast.Constant):
            return int(node.value)
        if isinstance(node, ast.Name):
            if node.id not in self.values:
                raise TunableError(
                    f"name {node.id!r} is neither a tunable nor an integer #define "
                    f"(known: {sorted(self.values)})"
                )
            v = self.values[node.id]
            if not isinstance(v, int):
                raise TunableError(f"tunable {node.id} = {v!r} is not an integer")
            return v
        if isinstance(node, ast.UnaryOp):
            v = self.visit(node.operand)
            if isinstance(node.op, ast.USub):
                return -v
            if isinstance(node.op, ast.UAdd):
                return v
            return int(v == 0)  # ast.Invert stands for C's logical '!'
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                return int(all(self.visit(v) for v in node.values))
            return int(any(self.visit(v) for v in node.values))
        if isinstance(node, ast.Compare):
            a, b = self.visit(node.left), self.visit(node.comparators[0])
            op = node.ops[0]
            return int(
                (isinstance(op, ast.Eq) and a == b)
                or (isinstance(op, ast.NotEq) and a != b)
                or (isinstance(op, ast.Lt) and a < b)
                or (isinstance(op, ast.LtE) and a <= b)
                or (isinstance(op, ast.Gt) and a > b)
                or (isinstance(op, ast.GtE) and a >= b)
            )
        if isinstance(node, ast.BinOp):
            a, b = self.visit(node.left), self.visit(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            if b == 0:
                raise TunableError("division by zero")
            q = abs(a) // abs(b)
            q = q if (a >= 0) == (b >= 0) else -q  # C: truncate toward zero
            return q if isinstance(node.op, ast.Div) else a - b * q
        raise TunableError(f"unsupported expression node {type(node).__name__}")
