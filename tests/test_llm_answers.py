"""The corpus of messy model answers (tests/fixtures/llm/answers/): each answer's expected
outcome, through the same path the mutator uses (mutators.llm.answer.interpret.interpret), and the table
of docs/llm.md that lists them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mutators.llm.answer.interpret import ORDER_NOTE, interpret
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
        # a refused patch answer always says how blocks apply (genesis asks for a whole file)
        assert r.feedback.endswith("\n" + ORDER_NOTE) == (case["kind"] != "genesis")


def _case(name: str, kind: str = "optimize"):
    text = next((FIX / "answers").glob(f"{name}*")).read_text()
    return interpret(text, kind=kind, parent_source=None if kind == "genesis" else (FIX / "parent_matvec.cu").read_text())


def test_an_ambiguous_search_is_fed_back_with_both_places():
    r = _case("35_")
    assert r.problems == ("1 of 1 SEARCH blocks could not be applied (1 matched more than once)",)
    (u,) = r.unmatched
    assert u.kind == "ambiguous" and u.match_lines == (99, 128)
    assert "matches 2 times (exactly), at lines 99 and 128" in r.feedback
    assert "it matches at line 99; the lines around it there:" in r.feedback
    assert "const Vec<V> av = gA(rows[r], c);" in r.feedback and "smem[r][lane]" in r.feedback  # what tells them apart


def test_a_draft_then_final_answer_is_refused_not_applied_at_the_other_loop():
    r = _case("36_")
    assert r.child is None
    (u,) = r.unmatched
    assert u.kind == "replaced" and u.index == 1 and u.match_lines == (131,)
    assert "lines 122-123 of the source before any block" in r.feedback
    assert "at line 131 (ignoring indentation), another place, where it was not applied" in r.feedback
    assert "send only the final block" in r.feedback


def test_elided_whole_files_and_replace_sections_are_refused_with_the_fix():
    r = _case("37_")
    assert r.form == "whole_file" and r.child is None
    assert "'// ... unchanged ...'" in r.problems[0] and "would be deleted" in r.problems[0]
    assert "SEARCH/REPLACE blocks" in r.feedback and "complete file" in r.feedback
    g = _case("41_", kind="genesis")
    assert "'/* ... */'" in g.problems[0] and "Send the complete file" in g.feedback and ORDER_NOTE not in g.feedback
    b = _case("42_")
    assert b.problems[0].startswith("REPLACE section of block 1 leaves code out (line 4: '// ... rest unchanged ...')")
    assert "leave them out of the block" in b.feedback


def test_harmless_variants_are_applied_and_noted():
    plain = _case("01_").child
    for name, note in (("38_", "ORIGINAL/UPDATED markers read as SEARCH/REPLACE"),
                       ("39_", "file names after the markers ignored"),
                       ("40_", "code fences inside 1 block(s) removed")):
        r = _case(name)
        assert r.ok and r.child == plain and note in r.notes, (name, r.notes)


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
