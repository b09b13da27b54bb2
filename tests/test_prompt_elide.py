"""The parent's source in a prompt: only the template's unreachable code is cut, a model's
patch still applies to the real source, and the prompt says what was elided.

Uses the real seeds (evo.tasks.seeds) and the real ABI header; no endpoint, no compiler.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from evo.core.records import Candidate, Member
from evo.tasks.seeds import seed_source
from mutators.base import MutationContext
from mutators.llm.answer.patch import Block, apply_blocks
from mutators.llm.prompt.context import SimpleContextProvider, TaskInfo
from mutators.llm.prompt.elide import MARKER_RE, elide_unreachable
from mutators.llm.prompt.fields import prompt_fields
from mutators.llm.prompt.ppcond import UNKNOWN, Macros, evaluate
from mutators.llm.prompt.ppscan import scan_directives

ABI = (Path(__file__).parents[1] / "evaluators" / "abi" / "evo_abi.h").read_text()
RELU = seed_source("kb19_relu")


def test_conditions_have_three_values():
    m = Macros(values={"A": "1", "B": "A + 1", "E": ""}, unknown={"T"}, undefined_prefixes=("EVO_",))
    assert evaluate("defined(A) && B == 2", m) == 1
    assert evaluate("defined(EVO_OP_X)", m) == 0, "an EVO_ name the source never defines is undefined"
    assert evaluate("defined(CUTLASS_ARCH_MMA_SM90_SUPPORTED)", m) is UNKNOWN, "a header's macro is unknown"
    assert evaluate("T && 0", m) == 0 and evaluate("T || 1", m) == 1, "the known operand decides"
    assert evaluate("T && 1", m) is UNKNOWN and evaluate("T == 2", m) is UNKNOWN
    assert evaluate("__has_include(<x>)", m) is UNKNOWN and evaluate("1 +", m) is UNKNOWN


def test_directives_in_comments_and_strings_are_not_directives():
    src = '/* \n#if X\n*/\nconst char* s = "#endif";\n#if A \\\n  && B  // c\n#endif\nR"(\n#if\n)";\n'
    ds = scan_directives(src)
    assert [(d.line, d.last_line, d.name, d.body) for d in ds] == [(5, 6, "if", "A && B"), (7, 7, "endif", "")]
    assert scan_directives("/* never closed\n#if A\n") is None


def test_relu_keeps_only_its_own_op_and_every_tunable_branch():
    shown = elide_unreachable(RELU, abi_header=ABI)
    text = shown.text
    assert "return x <= 0.f ? 0.f : x;" in text, "ReLU's own code stays"
    for other in ("return tanhf(x);", "log1pf(expf(x))", "a.s0 * expm1f(x)", "erff(x * 0.7", "rowscale_kernel<VEC><<<"):
        assert other not in text, f"{other}: another op's code is shown"
    # tunables arrive as -D and a child may change their defaults: their branches all stay
    assert "#if CACHE_HINT" in text and "__ldcs" in text
    assert len(MARKER_RE.findall(text)) == len(shown.regions) >= 2
    # each marker names the real lines it stands for, and only unreachable lines are cut
    lines = RELU.split("\n")
    for first, last in shown.regions:
        assert f"lines {first}-{last}," in text
        cut = "\n".join(lines[first - 1:last])
        assert "EVO_OP_RELU" not in cut.replace("defined(EVO_OP_RELU)", "")
    assert shown.chars_saved > 0.2 * len(RELU)
    # the same source with another op: its code stays, ReLU's goes
    sig = elide_unreachable(seed_source("kb21_sigmoid"), abi_header=ABI).text
    assert "expf(-x)" in sig and "return x <= 0.f ? 0.f : x;" not in sig


def test_if_constexpr_on_a_fixed_macro_is_cut_and_on_anything_else_kept():
    src = ("// @evo:task-config\n#define EPILOGUE 0\n// @tunable BM = 64 in {64, 128}\n#ifndef BM\n#define BM 64\n#endif\n"
           "void f(float* c, int n) {\n"
           "  if constexpr (EPILOGUE == 1) {\n" + "    c[0] = 1.0f;  // a long enough bias epilogue line here\n" * 6 +
           "  } else {\n    c[0] = 0.0f;\n  }\n"
           "  if constexpr (BM == 64) {\n" + "    c[1] = 2.0f;  // a tunable-dependent path stays visible\n" * 6 +
           "  }\n}\n")
    shown = elide_unreachable(src)
    assert shown.regions == ((9, 14),), shown.text
    assert "c[0] = 0.0f;" in shown.text and shown.text.count("c[1] = 2.0f;") == 6


def test_a_patch_written_against_the_view_applies_to_the_real_source():
    """SEARCH blocks are matched against the whole file: text a model copies from the shown
    lines is in the real source, and the child keeps every elided line."""
    shown = elide_unreachable(RELU, abi_header=ABI)
    old = "  return x <= 0.f ? 0.f : x;\n"
    assert old in shown.text
    res = apply_blocks(RELU, [Block(old, "  return fmaxf(x, 0.f) + 0.f * x;\n")])
    child = res.source
    assert res.ok and "fmaxf(x, 0.f)" in child
    assert child.replace("  return fmaxf(x, 0.f) + 0.f * x;\n", old) == RELU, "nothing else changed"
    # a SEARCH that spans a marker line matches nothing: it is reported, never applied elsewhere
    marker_line = next(ln for ln in shown.text.split("\n") if MARKER_RE.match(ln))
    bad = apply_blocks(RELU, [Block(marker_line + "\n#endif\n", "#endif\n")])
    assert bad.unmatched and bad.source == RELU


def _member(source: str, task: str = "kb19_relu") -> Member:
    return Member(candidate=Candidate.create(task, source, {}, operator="seed"), fitness=1.0)


def _info() -> TaskInfo:
    return TaskInfo(reference_src="def relu(x):\n    return torch.relu(x)", abi_text=ABI, shapes_text="- N=8",
                    dtype="float32", tolerance_text="exact")


def test_the_prompt_shows_the_view_and_says_what_was_elided():
    seed = _member(RELU)
    prov = SimpleContextProvider({"kb19_relu": _info()}, histories={seed.id: [(0, 1.0)]})
    f, _ = prompt_fields("optimize", seed, MutationContext("kb19_relu", 0, 1), provider=prov, n_inspirations=0,
                         attempts_text=lambda k: "", feedback=None, failure=lambda m: ("", "", ""))
    assert "log1pf(expf(x))" not in f["parent_source"] and MARKER_RE.search(f["parent_source"])
    assert "not shown" in f["elided"] and "do not edit" in f["elided"] and "SEARCH" in f["elided"]
    regions = elide_unreachable(RELU, abi_header=ABI).regions
    assert all(f"{a}-{b}" in f["elided"] for a, b in regions)


def test_a_repair_never_hides_the_lines_its_error_points_at():
    """A policy violation inside a branch this task never compiles (the policy reads every
    branch): the repair prompt keeps that region visible, numbered as in the whole file."""
    lines = RELU.split("\n")
    at = next(i for i, ln in enumerate(lines) if "return tanhf(x);" in ln)
    lines.insert(at, '  fprintf(stderr, "x");')
    broken_src = "\n".join(lines)
    broken = Member(candidate=Candidate.create("kb19_relu", broken_src, {}, operator="llm:m"), fitness=None)
    err = f"line {at + 1}: [no-host-file-io] file I/O `fprintf`\n    fprintf(stderr, \"x\");"
    prov = SimpleContextProvider({"kb19_relu": _info()}, failures={broken.id: ("policy", "rejected", err)})
    f, _ = prompt_fields("repair", broken, MutationContext("kb19_relu", 0, 1), provider=prov, n_inspirations=0,
                         attempts_text=lambda k: "", feedback=None, failure=lambda m: ("policy", "rejected", err))
    assert 'fprintf(stderr, "x");' in f["parent_source"], "the offending line is shown"
    assert "log1pf(expf(x))" in f["parent_source"], "the region holding it is shown whole"
    assert "rowscale_kernel<VEC><<<" not in f["parent_source"], "other unreachable regions are still elided"
    assert f">> {at + 1:4d} |" in f["failing_lines"]


@pytest.mark.parametrize("task", ["kb23_softmax", "gemm_bf16", "kb04_matvec"])
def test_every_elided_line_of_other_seeds_is_real_and_unreachable(task):
    """No marker stands for a line that holds the task's own config or a tunable's guard."""
    src = seed_source(task)
    shown = elide_unreachable(src, abi_header=ABI)
    lines = src.split("\n")
    from evo.core.tunables import parse_tunables

    names = {t.name for t in parse_tunables(src)}
    for first, last in shown.regions:
        cut = lines[first - 1:last]
        assert not any(ln.strip().startswith(f"#define {n} ") for ln in cut for n in names), (task, first, last)
    kept = [ln for ln in shown.text.split("\n") if not MARKER_RE.match(ln)]
    assert all(ln in lines for ln in kept), "the view shows only lines of the real source"
