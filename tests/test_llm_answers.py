"""The corpus of messy model answers (tests/fixtures/llm/answers/): each answer's expected
outcome, through the same path the mutator uses (mutators.llm.answer.interpret.interpret), and the table
of docs/llm.md that lists them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mutators.llm.answer.interpret import interpret
from mutators.llm.answer.patch import validate_child

FIX = Path(__file__).parent / "fixtures" / "llm"
CASES = json.loads((FIX / "answers" / "cases.json").read_text())
DOCS = Path(__file__).parents[1] / "docs" / "llm.md"


def test_the_corpus_is_large_and_covers_the_shapes_seen():
    assert len(CASES) >= 25
    names = " ".join(c["file"] for c in CASES)
    for shape in ("fence", "crlf", "tabs", "think", "unified_diff", "line_numbers", "truncated", "json", "whole_file",
                  "prose", "no_op", "genesis", "repair"):
        assert shape in names, shape
    assert {c["outcome"] for c in CASES} == {"ok", "rejected"}


@pytest.mark.parametrize("case", CASES, ids=[c["file"][:-4] for c in CASES])
def test_each_answer_has_its_expected_outcome(case):
    text = (FIX / "answers" / case["file"]).read_bytes().decode("utf-8")
    parent = (FIX / case["parent"]).read_text() if case["parent"] else None
    r = interpret(text, kind=case["kind"], parent_source=parent, finish_reason=case.get("finish_reason"))
    if case["outcome"] == "ok":
        assert r.ok, (r.problems, r.feedback)
        assert case["expect"] in r.child
        assert r.child != parent and validate_child(parent, r.child, allow_whole_file=parent is None) == []
        assert r.feedback == ""
    else:
        assert not r.ok
        said = " ".join(r.problems) + "\n" + r.feedback
        assert case["expect"] in said, said
        assert r.feedback, "a rejection always says what to do next"


def test_crlf_fixture_really_has_crlf():
    raw = next((FIX / "answers").glob("*crlf*")).read_bytes()
    assert raw.count(b"\r\n") >= 5 and b"\n" not in raw.replace(b"\r\n", b"")


def test_format_feedback_carries_an_example():
    r = interpret("Use more threads.", kind="optimize", parent_source=(FIX / "parent_matvec.cu").read_text())
    assert "<<<<<<< SEARCH" in r.feedback and ">>>>>>> REPLACE" in r.feedback


def test_docs_table_lists_every_case():
    text = DOCS.read_text()
    for c in CASES:
        row = next((ln for ln in text.splitlines() if ln.startswith(f"| `{c['file']}`")), None)
        assert row is not None, f"docs/llm.md has no corpus row for {c['file']}"
        assert f"| {c['outcome']} |" in row, row
