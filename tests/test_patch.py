"""SEARCH/REPLACE parsing, tolerant application and child validation (mutators/llm/answer/patch.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mutators.llm.answer.patch import (
    ABI_PARAM_TYPES,
    Block,
    apply_blocks,
    evo_launch_signature,
    extract_whole_file,
    parse_blocks,
    render_blocks,
    validate_child,
)

KERNEL = (Path(__file__).parent / "fixtures" / "llm" / "tiny_kernel.cu").read_text()


# ---- parse ------------------------------------------------------------------------------


def test_parse_tolerates_prose_and_fences():
    text = (
        "I will change the index maths.\n\n```cpp\n<<<<<<< SEARCH\n  a = 1;\n=======\n  a = 2;\n>>>>>>> REPLACE\n```\n"
        "And another:\n<<<<<<<  SEARCH  \nb();\n=======\n>>>>>>> REPLACE\nThanks!"
    )
    r = parse_blocks(text)
    assert r.ok
    assert r.blocks == (Block("  a = 1;\n", "  a = 2;\n"), Block("b();\n", ""))
    assert r.blocks[0].line == 4


def test_parse_reports_broken_blocks_with_positions():
    text = (
        "<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n"  # fine
        "<<<<<<< SEARCH\nno divider\n"  # broken: next SEARCH comes first
        "<<<<<<< SEARCH\nz\n=======\nw\n"  # broken: no end
    )
    r = parse_blocks(text)
    assert r.blocks == (Block("x\n", "y\n"),)
    assert len(r.errors) == 2
    assert r.errors[0].line == 6 and "divider" in r.errors[0].message
    assert r.errors[1].line == 8 and "REPLACE" in r.errors[1].message


def test_parse_reports_stray_replace_marker():
    r = parse_blocks("text\n>>>>>>> REPLACE\n")
    assert not r.blocks and r.errors and r.errors[0].line == 2


def test_parse_crlf():
    r = parse_blocks("<<<<<<< SEARCH\r\na\r\n=======\r\nb\r\n>>>>>>> REPLACE\r\n")
    assert r.blocks == (Block("a\n", "b\n"),)


_line = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"), blacklist_characters="<=>\r\n\x0b\x0c\x1c\x1d\x1e\x85"),
    max_size=20,
)
_lines_text = st.lists(_line, max_size=5).map(lambda ls: "".join(l + "\n" for l in ls))


@settings(deadline=None)
@given(st.lists(st.builds(Block, _lines_text, _lines_text), max_size=5))
def test_parse_render_roundtrip(blocks):
    r = parse_blocks(render_blocks(blocks))
    assert r.errors == ()
    assert list(r.blocks) == blocks


@settings(deadline=None)
@given(st.lists(st.builds(Block, _lines_text, _lines_text), max_size=4), st.text(alphabet="abc \n.,!?", max_size=40))
def test_parse_roundtrip_with_prose(blocks, prose):
    text = prose + "\n" + render_blocks(blocks).replace(">>>>>>> REPLACE\n", ">>>>>>> REPLACE\nsome words\n") + prose
    assert list(parse_blocks(text).blocks) == blocks


# ---- apply ------------------------------------------------------------------------------


def test_apply_exact_and_order():
    src = "a\nb\nc\nb\n"
    res = apply_blocks(src, [Block("b\n", "B\n"), Block("b\n", "X\n")])
    assert res.source == "a\nB\nc\nX\n"  # each once, at its first match in the current source
    assert res.applied == (0, 1) and not res.unmatched


def test_apply_matches_whole_lines_only():
    res = apply_blocks("max = 1;\nx = 1;\n", [Block("x = 1;\n", "x = 2;\n")])
    assert res.source == "max = 1;\nx = 2;\n"


def test_apply_whitespace_tolerant_reindents():
    src = "void f() {\n    if (x) {\n        y = 1;\n    }\n}\n"
    blk = Block("if (x) {\n    y  = 1;   \n}\n", "if (x) {\n    y = 2;\n}\n")
    res = apply_blocks(src, [blk])
    assert res.source == "void f() {\n    if (x) {\n        y = 2;\n    }\n}\n"
    assert res.fuzzy == (0,)


def test_apply_ignores_blank_line_differences():
    src = "a();\n\nb();\nc();\n"
    res = apply_blocks(src, [Block("a();\nb();\n", "ab();\n")])
    assert res.source == "ab();\nc();\n"


def test_apply_last_line_without_newline():
    res = apply_blocks("x\ny", [Block("y\n", "z\n")])
    assert res.source == "x\nz"


def test_unmatched_reports_closest_snippet():
    res = apply_blocks(KERNEL, [Block("  int64_t n = evo_numel(in[1]);\n  if (n == 0) return 7;\n", "x\n")])
    assert res.applied == ()
    (u,) = res.unmatched
    assert u.index == 0 and "evo_numel(in[0])" in u.closest_match_snippet
    assert KERNEL.splitlines()[u.closest_line - 1] in u.closest_match_snippet


def test_empty_search_is_unmatched():
    res = apply_blocks("a\n", [Block("", "b\n")])
    assert res.source == "a\n" and res.unmatched[0].reason.startswith("SEARCH section is empty")


# Property tests: random line-based sources with unique lines, random non-overlapping edits.

_word = st.text(alphabet="abcdefghij(){};=+*", min_size=1, max_size=8)


@st.composite
def _edited(draw):
    n = draw(st.integers(1, 30))
    indents = draw(st.lists(st.sampled_from(["", "  ", "    ", "\t"]), min_size=n, max_size=n))
    words = draw(st.lists(_word, min_size=n, max_size=n))
    lines = [f"{indents[i]}L{i} {words[i]}\n" for i in range(n)]
    # pick non-overlapping spans
    cuts = sorted(set(draw(st.lists(st.integers(0, n), max_size=8))))
    spans = []
    prev = 0
    for c in cuts:
        if c > prev and draw(st.booleans()):
            a = draw(st.integers(prev, c - 1))
            spans.append((a, c))
        prev = c
    edits = []
    for k, (a, z) in enumerate(spans):
        new = [f"{indents[a]}N{k}_{j} {w}\n" for j, w in enumerate(draw(st.lists(_word, max_size=4)))]
        edits.append((a, z, new))
    return lines, edits


def _apply_edits(lines, edits):
    out, pos = [], 0
    for a, z, new in edits:
        out += lines[pos:a] + new
        pos = z
    return "".join(out + lines[pos:])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_edited())
def test_blocks_from_random_edits_reproduce_the_edit(case):
    lines, edits = case
    blocks = [Block("".join(lines[a:z]), "".join(new)) for a, z, new in edits]
    res = apply_blocks("".join(lines), blocks)
    assert res.unmatched == ()
    assert res.source == _apply_edits(lines, edits)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_edited(), st.integers(0, 4), st.data())
def test_whitespace_perturbed_search_still_applies(case, shift, data):
    lines, edits = case
    pad = " " * shift
    blocks = []
    for a, z, new in edits:
        search = []
        for ln in lines[a:z]:
            body = ln.rstrip("\n")
            if data.draw(st.booleans()):
                stripped = body.lstrip()
                body = body[: len(body) - len(stripped)] + stripped.replace(" ", "   ")  # internal whitespace
            if data.draw(st.booleans()):
                body += " \t "  # trailing whitespace
            search.append(pad + body + "\n")
        # a model that mis-indents its SEARCH mis-indents its REPLACE the same way
        blocks.append(Block("".join(search), "".join(pad + r for r in new)))
    res = apply_blocks("".join(lines), blocks)
    assert res.unmatched == ()
    assert res.source == _apply_edits(lines, edits)


@settings(max_examples=100, deadline=None)
@given(_edited(), st.lists(_word, min_size=1, max_size=3))
def test_unmatched_blocks_are_always_reported(case, junk):
    lines, edits = case
    bogus = Block("".join(f"ZZ {w}\n" for w in junk), "whatever\n")
    blocks = [Block("".join(lines[a:z]), "".join(new)) for a, z, new in edits]
    pos = len(blocks) // 2
    blocks.insert(pos, bogus)
    res = apply_blocks("".join(lines), blocks)
    assert [u.index for u in res.unmatched] == [pos]
    assert res.unmatched[0].search_text == bogus.search
    assert sorted(res.applied + tuple(u.index for u in res.unmatched)) == list(range(len(blocks)))
    assert res.source == _apply_edits(lines, edits)


# ---- whole files and validation ---------------------------------------------------------------


def test_extract_whole_file():
    assert extract_whole_file("Here:\n```cuda\n" + KERNEL + "```\nDone.") == KERNEL
    assert extract_whole_file(KERNEL) == KERNEL
    assert extract_whole_file("just prose about evo_launch") is None
    assert extract_whole_file("<<<<<<< SEARCH\n```cuda\n" + KERNEL + "```\n=======\n>>>>>>> REPLACE\n") is None


def test_signature_and_validation():
    assert evo_launch_signature(KERNEL) == ABI_PARAM_TYPES
    child = KERNEL.replace("d(i) = s(i);", "d(i) = s(i) * 1.0f;")
    assert validate_child(KERNEL, child) == []
    assert validate_child(None, KERNEL, whole_file=True, allow_whole_file=True) == []


@pytest.mark.parametrize(
    "edit, expect",
    [
        (lambda s: s.replace("  if (i < n)", "    if (i < n)"), "no-op"),
        (lambda s: s.replace("evo_launch", "my_launch"), "evo_launch entry point missing"),
        (lambda s: s.replace("int n_scalars, cudaStream_t stream", "cudaStream_t stream"), "signature changed"),
        (lambda s: s.replace('#include "evo_abi.h"\n', ""), "evo_abi.h"),
        (lambda s: s.replace("d(i) = s(i);", "d(i) = s(i);\n>>>>>>> REPLACE"), "conflict marker"),
    ],
)
def test_validation_problems(edit, expect):
    problems = validate_child(KERNEL, edit(KERNEL))
    assert any(expect in p for p in problems), problems


def test_whole_file_rejected_unless_allowed():
    child = KERNEL.replace("d(i) = s(i);", "d(i) = s(i) + 0.0f;")
    assert any("whole-file rewrite" in p for p in validate_child(KERNEL, child, whole_file=True))
    assert validate_child(KERNEL, child, whole_file=True, allow_whole_file=True) == []


def test_restrict_and_param_names_do_not_change_the_signature():
    child = KERNEL.replace("const double* scalars", "const double* __restrict__ sc").replace("EvoTensor* out", "EvoTensor *o")
    assert evo_launch_signature(child) == ABI_PARAM_TYPES
