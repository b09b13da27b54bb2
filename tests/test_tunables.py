"""evo.core.tunables: annotation parsing, defaults, value checks and safe C-like constraints."""

from __future__ import annotations

import pytest

from evo.core.tunables import (
    Constraint,
    Tunable,
    TunableError,
    check_tunable_defaults,
    evaluate_constraint,
    parse_constraints,
    parse_int_constants,
    parse_tunables,
    resolve_params,
    violated_constraints,
)

SRC = """\
#define EVO_ELEM_BYTES 4
// @tunable BLOCK = 256 in {128, 256, 512}
//   @tunable   VEC=4 in {1,2,4}
// @tunable LAYOUT = ROW in {ROW, COL}
// @constraint BLOCK * VEC <= 1024
// @constraint VEC * EVO_ELEM_BYTES <= 16
#ifndef BLOCK
#define BLOCK 256
#endif
#ifndef VEC
#define VEC 4
#endif
#ifndef LAYOUT
#define LAYOUT ROW
#endif
"""


def test_parse_tunables_values_and_order():
    assert parse_tunables(SRC) == (
        Tunable("BLOCK", "256", ("128", "256", "512")),
        Tunable("VEC", "4", ("1", "2", "4")),
        Tunable("LAYOUT", "ROW", ("ROW", "COL")),
    )


def test_parse_constraints_keeps_lines():
    assert parse_constraints(SRC) == (
        Constraint("BLOCK * VEC <= 1024", 5),
        Constraint("VEC * EVO_ELEM_BYTES <= 16", 6),
    )


@pytest.mark.parametrize(
    "line",
    [
        "// @tunable BLOCK = 256 in {}",
        "// @tunable BLOCK = 256 in {128, 512}",  # default outside the set
        "// @tunable BLOCK = 256 in {256, 256}",
        "// @tunable BLOCK 256 in {256}",
        "// @tunable BLOCK = 2.5 in {2.5}",
    ],
)
def test_malformed_tunables_raise(line):
    with pytest.raises(TunableError):
        parse_tunables(line)


def test_duplicate_tunable_raises():
    with pytest.raises(TunableError, match="declared twice"):
        parse_tunables("// @tunable A = 1 in {1}\n// @tunable A = 1 in {1, 2}\n")


def test_resolve_params_fills_defaults_and_normalises():
    assert resolve_params(SRC, {"VEC": 2}) == {"BLOCK": "256", "VEC": "2", "LAYOUT": "ROW"}
    assert resolve_params(SRC, {"LAYOUT": "COL", "BLOCK": 512.0}) == {"BLOCK": "512", "VEC": "4", "LAYOUT": "COL"}
    assert resolve_params(SRC, None)["BLOCK"] == "256"


def test_resolve_params_errors_name_the_tunable_and_choices():
    with pytest.raises(ValueError, match=r"BLOCK = '64'.*128, 256, 512"):
        resolve_params(SRC, {"BLOCK": 64})
    with pytest.raises(ValueError, match=r"unknown tunable.*TILE_M.*BLOCK"):
        resolve_params(SRC, {"TILE_M": 64})


def test_int_constants_first_definition_wins():
    src = "#define A 3\n#ifndef A\n#define A 5\n#endif\n#define B (-2)\n#define C float\n"
    assert parse_int_constants(src) == {"A": 3, "B": -2}


def test_violated_constraints_with_defaults_and_values():
    assert violated_constraints(SRC) == []
    assert violated_constraints(SRC, {"BLOCK": 512, "VEC": 4}) == ["line 5: BLOCK * VEC <= 1024"]
    assert violated_constraints(SRC, {"BLOCK": 512, "VEC": 2}) == []


def test_constraint_that_cannot_evaluate_counts_as_violated():
    src = "// @tunable A = 0 in {0, 1}\n// @constraint 8 / A == 8\n// @constraint NOPE > 1\n// @constraint A >= 0\n"
    out = violated_constraints(src)
    assert len(out) == 2
    assert "division by zero" in out[0]
    assert "NOPE" in out[1]
    assert violated_constraints(src, {"A": 1}) == ["line 3: NOPE > 1 (cannot evaluate: name 'NOPE' is neither "
                                                   "a tunable nor an integer #define (known: ['A']))"]


@pytest.mark.parametrize(
    "expr, value",
    [
        ("7 / 2", 3),
        ("-7 / 2", -3),  # C truncates toward zero (Python's // would give -4)
        ("7 / -2", -3),
        ("-7 % 2", -1),  # sign of the dividend
        ("7 % -2", 1),
        ("-8 / 2", -4),
        ("2 + 3 * 4", 14),
        ("(2 + 3) * 4", 20),
        ("1 || 0 && 0", 1),  # && binds tighter than ||
        ("!0", 1),
        ("!5", 0),
        ("!0 == 1", 1),
        ("!3 == 0", 1),  # C: (!3) == 0; Python's `not 3 == 0` would give not (3 == 0) = 1 too
        ("!2 == 2", 0),
        ("!(2 == 2)", 0),
        ("3 - !0", 2),
        ("-(-3)", 3),
        ("TILE_M % 64 == 0", 1),
        ("TILE_M % 64 == 0 && TILE_M >= 128", 0),
        ("TILE_M * 2 * STAGES <= 227 * 1024", 1),
        ("5 > 3 != 0", 1),  # a comparison chain: rejected, must be parenthesised
    ],
)
def test_c_semantics(expr, value):
    vals = {"TILE_M": 64, "STAGES": 4}
    if expr == "5 > 3 != 0":
        with pytest.raises(TunableError, match="chains comparisons"):
            evaluate_constraint(expr, vals)
        assert evaluate_constraint("(5 > 3) != 0", vals) == value
        return
    assert evaluate_constraint(expr, vals) == value


def test_logical_not_binds_like_c():
    # C: !A * 2 == (!A) * 2. With A = 3: 0 * 2 = 0. A Python `not A * 2` would negate A * 2 (also 0),
    # so use addition to tell them apart: !A + 1 is (!A) + 1 = 1 in C, not (A + 1) = False in Python.
    assert evaluate_constraint("!A + 1", {"A": 3}) == 1


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('true')",
        "A.__class__",
        "open('x')",
        "A ** 100",
        "[1, 2]",
        "A if A else 1",
        "lambda: 1",
        "A and 1",  # Python keywords are not C
        "1; 2",
        "A[0]",
        "1.5 < A",
        "'s' == A",
        "A ~ 1",
        "A & 1",
        "",
        "9" * 600,
    ],
)
def test_malicious_or_foreign_expressions_rejected(expr):
    with pytest.raises(TunableError):
        evaluate_constraint(expr, {"A": 1})
    with pytest.raises(TunableError):
        parse_constraints(f"// @constraint {expr}\n" if expr else "// @constraint  \n")


def test_identifier_valued_tunable_in_arithmetic_is_an_error():
    src = "// @tunable L = ROW in {ROW, COL}\n// @constraint L > 1\n"
    assert "not an integer" in violated_constraints(src)[0]


def test_check_tunable_defaults():
    assert check_tunable_defaults(SRC) == []
    bad = SRC.replace("#define VEC 4", "#define VEC 2").replace("#ifndef LAYOUT\n#define LAYOUT ROW\n#endif\n", "")
    problems = check_tunable_defaults(bad)
    assert len(problems) == 2
    assert "VEC" in problems[0] and "'2'" in problems[0]
    assert "LAYOUT" in problems[1] and "#ifndef" in problems[1]
