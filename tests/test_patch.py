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
    elided_lines,
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


def test_parse_reads_original_updated_markers_and_file_names():
    for head, tail in (("<<<<<<< ORIGINAL", ">>>>>>> UPDATED"), ("<<<<<<< SEARCH kernel.cu", ">>>>>>> REPLACE"),
                       ("<<<<<<< SEARCH: `src/kernel.cu`", ">>>>>>> REPLACE kernel.cu")):
        r = parse_blocks(f"{head}\na\n=======\nb\n{tail}\n")
        assert r.ok and r.blocks == (Block("a\n", "b\n"),), head
    assert parse_blocks("<<<<<<< ORIGINAL\na\n=======\nb\n>>>>>>> UPDATED\n").notes == (
        "ORIGINAL/UPDATED markers read as SEARCH/REPLACE",)
    assert "file names after the markers ignored" in parse_blocks("<<<<<<< SEARCH k.cu\na\n=======\nb\n>>>>>>> REPLACE\n").notes
    # prose after the word is not a file name: not a marker (a stray REPLACE is then reported)
    assert not parse_blocks("<<<<<<< SEARCH in the kernel\na\n=======\nb\n>>>>>>> REPLACE\n").ok
    assert not parse_blocks("<<<<<<< HEAD\na\n=======\nb\n>>>>>>> fix\n").blocks  # git conflict markers are not blocks


def test_parse_removes_fences_inside_a_block():
    text = "<<<<<<< SEARCH\n```cuda\n  a = 1;\n```\n=======\n\n```cpp\n  a = 2;\n```\n\n>>>>>>> REPLACE\n"
    r = parse_blocks(text)
    assert r.blocks == (Block("  a = 1;\n", "  a = 2;\n"),)
    assert r.notes == ("code fences inside 1 block(s) removed",)
    # an empty REPLACE in fences deletes
    assert parse_blocks("<<<<<<< SEARCH\nx\n=======\n```cuda\n```\n>>>>>>> REPLACE\n").blocks == (Block("x\n", ""),)


def test_elided_lines():
    for line in ("// ... unchanged ...", "  // ... rest of the code ...", "/* ... */", "// (unchanged)", "...", "// …",
                 "// ... existing code ...", "// [rest of kernel unchanged]", "// rest of the file is unchanged",
                 "/* ... other activations ... */", "// Same as before.", "// (omitted for brevity)", "  /* unchanged */"):
        assert elided_lines(f"int a;\n{line}\nint b;\n") == [(2, line.strip())], line
    for line in ("// Kahan-compensated sum ...", "// wait for the loads...", "// unchanged from the seed: the loop below",
                 "// the rest of the kernel is memory-bound", "int x = 0; // ...", "// TODO ...", "// step 1 ... step 2",
                 "// launch the kernel ...", "for (;;) {}"):
        assert elided_lines(line) == [], line
    # a comment the parent has itself is its own, not an elision
    assert elided_lines("// ... unchanged ...\n", parent="x\n  // ... unchanged ...\n") == []
    # no seed kernel has a line that reads as an elision
    root = Path(__file__).parents[1]
    seeds = sorted((root / "evo" / "tasks" / "kernels").rglob("*.cu")) + sorted((root / "benchmarks").rglob("*.cu"))
    assert len(seeds) >= 5 and [s.name for s in seeds if elided_lines(s.read_text())] == []


def test_parse_crlf():
    r = parse_blocks("<<<<<<< SEARCH\r\na\r\n=======\r\nb\r\n>>>>>>> REPLACE\r\n")
    assert r.blocks == (Block("a\n", "b\n"),)


# no "`": a line that is only a fence (```cuda) inside a block is markup, removed by parse_blocks
_line = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"), blacklist_characters="<=>`\r\n\x0b\x0c\x1c\x1d\x1e\x85"),
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
    src = "a\nb\nc\nd\n"
    # the second block quotes what the first one wrote: blocks apply in order, each to the result
    res = apply_blocks(src, [Block("b\n", "B\n"), Block("B\nc\n", "X\n")])
    assert res.source == "a\nX\nd\n"
    assert res.applied == (0, 1) and not res.unmatched


def test_a_search_that_matches_twice_is_refused_with_both_lines():
    src = "a\nb\nc\nb\n"
    res = apply_blocks(src, [Block("b\n", "B\n")])
    assert res.source == src and res.applied == ()
    (u,) = res.unmatched
    assert u.kind == "ambiguous" and u.match_lines == (2, 4)
    assert "matches 2 times (exactly), at lines 2 and 4" in u.reason and "add unchanged lines" in u.reason
    assert u.match_context == ("a\nb\nc\nb\n", "b\nc\nb\n")  # two lines around each match
    # with a context line it matches once and applies
    assert apply_blocks(src, [Block("b\nc\n", "B\nc\n")]).source == "a\nB\nc\nb\n"
    # before: the first match was edited silently; the second block then took the other one
    res = apply_blocks(src, [Block("b\n", "B\n"), Block("b\n", "X\n")])
    assert [u.kind for u in res.unmatched] == ["ambiguous", "ambiguous"] and res.source == src


def test_ambiguity_is_counted_at_the_first_level_that_matches():
    src = "f() {\n  x = 1;\n    x = 1;\n}\n"
    # exact once (the loose level would match twice): applied there
    res = apply_blocks(src, [Block("  x = 1;\n", "  x = 2;\n")])
    assert res.source == "f() {\n  x = 2;\n    x = 1;\n}\n" and not res.unmatched
    # only ignoring indentation, twice: refused
    res = apply_blocks(src, [Block("\tx = 1;\n", "\tx = 2;\n")])
    (u,) = res.unmatched
    assert u.kind == "ambiguous" and u.match_lines == (2, 3) and "(ignoring indentation)" in u.reason


SHUFFLES = ("void f() {\n"
            "  for (r) {\n"
            "    CUTE_UNROLL\n"
            "    for (off) v += shfl(v, off);\n"
            "  }\n"
            "  if (warp == 0) {\n"
            "      CUTE_UNROLL\n"
            "      for (off) v += shfl(v, off);\n"
            "  }\n"
            "}\n")


def test_a_draft_block_then_its_final_block_is_never_applied_at_the_other_loop():
    """The bug of issue 42: the draft edits the first loop; the final block quotes the same
    lines, which are gone there, and matched the second loop ignoring indentation: the final
    edit landed in the other loop (line 7), the draft's stayed in the first."""
    search = "    CUTE_UNROLL\n    for (off) v += shfl(v, off);\n"
    draft = Block(search, "    #pragma unroll\n    for (off) v += shfl(v, off);\n")
    final = Block(search, "    #pragma unroll 2\n    for (off) v += shfl(v, off);\n")
    res = apply_blocks(SHUFFLES, [draft, final])
    assert "#pragma unroll 2" not in res.source  # before: "      #pragma unroll 2" at line 7
    assert res.applied == (0,)
    (u,) = res.unmatched
    assert u.kind == "replaced" and u.replaced_by == 0 and u.match_lines == (7,)
    assert "lines 3-4 of the source before any block" in u.reason and "replaced by block 1" in u.reason
    assert "at line 7 (ignoring indentation), another place, where it was not applied" in u.reason
    assert "draft" in u.reason and u.closest_line == 7 and "      CUTE_UNROLL" in u.closest_match_snippet
    # the final block alone applies where it was meant
    assert apply_blocks(SHUFFLES, [final]).source.splitlines()[2] == "    #pragma unroll 2"
    # and the second loop, quoted as it is, is still editable after the first
    other = Block("      CUTE_UNROLL\n", "      #pragma unroll\n")
    assert apply_blocks(SHUFFLES, [draft, other]).source.count("#pragma unroll\n") == 2


def test_a_block_quoting_replaced_lines_that_match_nowhere_says_so():
    res = apply_blocks("a\nb\nc\n", [Block("b\n", "B\n"), Block("b\nc\n", "x\n")])
    (u,) = res.unmatched
    assert u.kind == "replaced" and u.match_lines == () and "replaced by block 1" in u.reason


def test_an_edit_on_top_of_an_earlier_blocks_lines_still_applies():
    """Block 1 wraps two lines in an if (re-indenting them); block 2 quotes one of them with
    its old indentation: it matches, ignoring indentation, the lines block 1 wrote: allowed."""
    src = "void f() {\n  x = 1;\n  y = 2;\n}\n"
    wrap = Block("  x = 1;\n  y = 2;\n", "  if (c) {\n    x = 1;\n    y = 2;\n  }\n")
    res = apply_blocks(src, [wrap, Block("  y = 2;\n", "  y = 3;\n")])
    assert not res.unmatched
    assert res.source == "void f() {\n  if (c) {\n    x = 1;\n    y = 3;\n  }\n}\n"


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


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_edited(), st.data())
def test_a_search_copied_twice_into_the_source_is_always_refused(case, data):
    """Any window of the source that occurs twice is refused, both lines named, nothing applied."""
    lines, _ = case
    a = data.draw(st.integers(0, len(lines) - 1))
    z = data.draw(st.integers(a + 1, len(lines)))
    at = data.draw(st.sampled_from([*range(0, a + 1), *range(z, len(lines) + 1)]))  # the copy goes outside the window
    src = lines[:at] + lines[a:z] + lines[at:]
    res = apply_blocks("".join(src), [Block("".join(lines[a:z]), "NEW\n")])
    (u,) = res.unmatched
    assert u.kind == "ambiguous" and len(u.match_lines) >= 2 and res.source == "".join(src)
    original = a + (z - a) if at <= a else a
    assert {original + 1, at + 1} <= set(u.match_lines)


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
