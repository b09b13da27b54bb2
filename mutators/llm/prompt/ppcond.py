"""``#if`` conditions evaluated with three values: true, false, or unknown.

:func:`evaluate` computes a condition the way the preprocessor would, from what is known of
each macro (:class:`Macros`): a known value, known to be undefined, or unknown (a tunable
that arrives as ``-D``, a macro of a header, anything the caller cannot vouch for). An
unknown operand makes the result unknown unless the other operand decides it (``0 && X``,
``1 || X``). Whatever the evaluator does not understand (function-like macros,
``__has_include``, a malformed expression) is unknown, never a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Macros", "evaluate", "UNKNOWN"]

#: The result of a condition (or a macro) whose value cannot be known.
UNKNOWN = None

_TOKEN_RE = re.compile(r"\s*(?:(?P<num>0[xX][0-9a-fA-F']+|\d[\d']*)(?:[uUlL]*)\b|(?P<id>[A-Za-z_]\w*)|"
                       r"(?P<op>&&|\|\||==|!=|<=|>=|<<|>>|[-+*/%<>!~&|^?:()]))")


@dataclass
class Macros:
    """What is known of the macros at one point of the source.

    ``values``: macros known to be defined, with their replacement text; ``undefined``:
    macros known not to be defined; ``undefined_prefixes``: a name with one of these
    prefixes that is in neither set is known not to be defined (the framework's own
    namespace, which no header uses); every other name is unknown.
    """

    values: dict[str, str] = field(default_factory=dict)
    undefined: set[str] = field(default_factory=set)
    unknown: set[str] = field(default_factory=set)
    undefined_prefixes: tuple[str, ...] = ()

    def defined(self, name: str) -> bool | None:
        if name in self.unknown:
            return UNKNOWN
        if name in self.values:
            return True
        if name in self.undefined or (self.undefined_prefixes and name.startswith(self.undefined_prefixes)):
            return False
        return UNKNOWN

    def define(self, name: str, value: str | None) -> None:
        """``value`` None: defined with an unknown value or not at all (the define sits on
        a path that may or may not be compiled)."""
        self.undefined.discard(name)
        self.values.pop(name, None)
        self.unknown.discard(name)
        if value is None:
            self.unknown.add(name)
        else:
            self.values[name] = value

    def undef(self, name: str, certain: bool) -> None:
        self.values.pop(name, None)
        self.unknown.discard(name)
        if certain:
            self.undefined.add(name)
        else:
            self.undefined.discard(name)
            self.unknown.add(name)


class _Unknown(Exception):
    pass


class _Parser:
    """Precedence climbing over the tokens of one expression; ``None`` is unknown."""

    _BINARY = {"||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6, "<": 7, ">": 7, "<=": 7, ">=": 7,
               "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "%": 10}

    def __init__(self, text: str, macros: Macros, depth: int) -> None:
        self.macros = macros
        self.depth = depth
        self.toks: list[tuple[str, str]] = []
        pos = 0
        text = text.rstrip()
        while pos < len(text):
            m = _TOKEN_RE.match(text, pos)
            if m is None or m.end() == pos:
                raise _Unknown(text[pos:])
            pos = m.end()
            kind = m.lastgroup or ""
            self.toks.append((kind, m.group(kind).replace("'", "")))
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        if self.i >= len(self.toks):
            raise _Unknown("end of expression")
        self.i += 1
        return self.toks[self.i - 1]

    def expect(self, op: str) -> None:
        if self.take() != ("op", op):
            raise _Unknown(op)

    def parse(self) -> int | None:
        v = self.conditional()
        if self.i != len(self.toks):
            raise _Unknown("trailing tokens")
        return v

    def conditional(self) -> int | None:
        c = self.binary(1)
        if self.peek() != ("op", "?"):
            return c
        self.take()
        a = self.conditional()
        self.expect(":")
        b = self.conditional()
        if c is UNKNOWN:
            return a if a == b and a is not UNKNOWN else UNKNOWN
        return a if c else b

    def binary(self, level: int) -> int | None:
        left = self.unary()
        while True:
            t = self.peek()
            if t is None or t[0] != "op" or self._BINARY.get(t[1], 0) < level:
                return left
            op = t[1]
            self.take()
            right = self.binary(self._BINARY[op] + 1)
            left = _apply(op, left, right)

    def unary(self) -> int | None:
        kind, text = self.take()
        if kind == "num":
            return int(text, 0) if not (len(text) > 1 and text[0] == "0" and text[1].isdigit()) else int(text, 8)
        if kind == "op":
            if text == "(":
                v = self.conditional()
                self.expect(")")
                return v
            v = self.unary()
            if text == "!":
                return UNKNOWN if v is UNKNOWN else int(not v)
            if text == "-":
                return UNKNOWN if v is UNKNOWN else -v
            if text == "+":
                return v
            if text == "~":
                return UNKNOWN if v is UNKNOWN else ~v
            raise _Unknown(text)
        if text == "defined":
            paren = self.peek() == ("op", "(")
            if paren:
                self.take()
            kind, name = self.take()
            if kind != "id":
                raise _Unknown(name)
            if paren:
                self.expect(")")
            d = self.macros.defined(name)
            return UNKNOWN if d is UNKNOWN else int(d)
        if text in ("true", "false"):
            return int(text == "true")
        if self.peek() == ("op", "("):
            raise _Unknown(f"{text}(...)")  # a function-like macro or __has_include: not evaluated
        d = self.macros.defined(text)
        if d is UNKNOWN:
            return UNKNOWN
        if not d:
            return 0  # an identifier that is not a macro is 0
        if self.depth > 8:
            return UNKNOWN
        return _evaluate(self.macros.values[text], self.macros, self.depth + 1)


def _apply(op: str, a: int | None, b: int | None) -> int | None:
    if op == "&&":
        if a == 0 or b == 0:
            return 0
        return UNKNOWN if a is UNKNOWN or b is UNKNOWN else 1
    if op == "||":
        if (a is not UNKNOWN and a != 0) or (b is not UNKNOWN and b != 0):
            return 1
        return UNKNOWN if a is UNKNOWN or b is UNKNOWN else 0
    if a is UNKNOWN or b is UNKNOWN:
        return UNKNOWN
    if op in ("/", "%") and b == 0:
        return UNKNOWN
    return {
        "|": lambda: a | b, "^": lambda: a ^ b, "&": lambda: a & b, "==": lambda: int(a == b),
        "!=": lambda: int(a != b), "<": lambda: int(a < b), ">": lambda: int(a > b), "<=": lambda: int(a <= b),
        ">=": lambda: int(a >= b), "<<": lambda: a << b if 0 <= b < 64 else UNKNOWN,
        ">>": lambda: a >> b if 0 <= b < 64 else UNKNOWN, "+": lambda: a + b, "-": lambda: a - b,
        "*": lambda: a * b, "/": lambda: int(a / b), "%": lambda: a - b * int(a / b),
    }[op]()


def _evaluate(text: str, macros: Macros, depth: int) -> int | None:
    try:
        return _Parser(text, macros, depth).parse()
    except (_Unknown, ValueError):
        return UNKNOWN


def evaluate(expr: str, macros: Macros) -> int | None:
    """The value of ``#if expr`` given ``macros``: an int (nonzero is true) or ``UNKNOWN``."""
    if not expr.strip():
        return UNKNOWN
    return _evaluate(expr, macros, 0)
