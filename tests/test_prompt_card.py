"""The CuTe reference card: its drifting parts come from their sources when it is rendered
(the CUTLASS version of the installed headers, the policy's allowlist and rules, the ABI
header), its idioms name only what the installed headers define, and it is in every kind of
prompt (genesis also gets an example kernel)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from evaluators.compile.toolchain import cutlass_include_dir, cutlass_version
from evaluators.policy import ALLOWED_INCLUDE_PATTERNS, POLICY_RULES, include_allowed
from evo.core.records import Candidate, Member
from evo.engine import llm_context
from mutators.base import MutationContext
from mutators.llm.prompt.card import CARD_FILE, CardFacts, readable_include, render_card
from mutators.llm.prompt.context import SimpleContextProvider
from mutators.llm.prompt.fields import prompt_fields
from mutators.llm.prompt.templates import PromptError, render_prompt


@pytest.fixture(scope="module")
def facts() -> CardFacts:
    return llm_context.card_facts()


def test_the_card_says_the_installed_version_read_at_run_time(facts, monkeypatch):
    card = render_card(facts)
    assert f"CUTLASS {cutlass_version()} " in card and "3.x / 4.x" not in card
    assert re.match(r"\d+\.\d+\.\d+$", cutlass_version())
    import evaluators.compile.toolchain as tc

    monkeypatch.setattr(tc, "cutlass_version", lambda: "9.8.7")
    assert "CUTLASS 9.8.7 " in render_card(llm_context.card_facts()), "read when rendered, not hard-coded"
    text = CARD_FILE.read_text()
    assert cutlass_version() not in text, "the card file itself names no version"


def test_every_policy_rule_and_include_is_on_the_card_from_the_policys_tables(facts):
    card = render_card(facts)
    rules = card.split("## Policy rules")[1]
    for rule in POLICY_RULES:
        assert f"\n- {rule.name}: {rule.reason}" in rules, rule.name
    assert len(re.findall(r"^- ", rules, re.MULTILINE)) == len(POLICY_RULES), "one line per rule"
    includes = re.findall(r"`([^`]+)`", card.split("## Includes allowed")[1].split("##")[0])
    assert len(includes) >= len(ALLOWED_INCLUDE_PATTERNS)
    for inc in includes:  # what the card allows, the policy allows (with `*` as any name)
        assert include_allowed(inc.replace("*", "x")), inc
    for banned in ("cstdio", "iostream", "cstdlib", "thread", "cublas_v2.h"):
        assert banned not in includes and not include_allowed(banned)
    # a pattern the card cannot spell is an error, not a silent omission
    with pytest.raises(PromptError, match="cannot spell"):
        readable_include(r"cu(da|dnn)\.h")


def test_the_abi_lines_come_from_the_header(facts):
    card = render_card(facts)
    assert "EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out, const double* " \
           "scalars, int n_scalars, cudaStream_t stream);" in card
    assert "helper: bool evo_is_aligned(const void* p, int bytes)" in card and "EVO_MAX_DIMS = 8" in card
    header = facts.abi_header.replace("static inline int evo_sm_count()", "static inline int evo_sm_count_v2()")
    assert "helper: int evo_sm_count_v2()" in render_card(replace(facts, abi_header=header))


def test_the_idioms_name_only_what_the_installed_headers_define(facts):
    idioms = render_card(facts).split("## Idioms")[1].split("## Includes")[0]
    names = set(re.findall(r"\b(make_\w+|local_\w+|SM\d+_\w+|\w+_op_selector|warpgroup_\w+|cp_async_\w+|cluster_\w+|"
                           r"Layout_\w+_Atom|Universal\w+|array_aligned|Cluster\w*Barrier|arrive_and_expect_tx|"
                           r"tile_to_shape|partition_\w+|CUTE_\w+)\b", idioms))
    names.discard("make_fragment_A")  # spelled make_fragment_A/B/C on the card
    assert len(names) > 20, names
    inc = cutlass_include_dir()
    text = "\n".join(p.read_text(errors="replace") for d in ("cute", "cutlass/arch") for p in (inc / d).rglob("*.h*"))
    missing = sorted(n for n in names if n not in text and n not in facts.abi_header)
    assert not missing, f"the card names what CUTLASS {facts.cutlass_version} does not define: {missing}"


def test_the_card_is_in_every_kind_of_prompt_and_genesis_shows_an_example(facts):
    info = llm_context.task_info("kb19_relu", "H200")
    assert info.card == llm_context.reference_card() and "# CuTe reference card" in info.card
    assert "EVO_EXPORT int evo_launch" in info.example_kernel and "return x <= 0.f" not in info.example_kernel, \
        "the example is another task's seed (not ReLU's own answer)"
    assert "matvec_kernel" in info.example_kernel and not info.example_kernel.startswith("//"), "header dropped"
    from evo.tasks import get_task

    assert "matvec_kernel" not in llm_context.genesis_example(get_task("kb04_matvec"))
    from evo.tasks.seeds import seed_source

    seed = Member(candidate=Candidate.create("kb19_relu", seed_source("kb19_relu"), {}, operator="seed"), fitness=1.0)
    broken = Member(candidate=Candidate.create("kb19_relu", seed_source("kb19_relu") + "x\n", {}, operator="s"),
                    fitness=None)
    prov = SimpleContextProvider({"kb19_relu": info}, histories={seed.id: [(0, 1.0)]})
    ctx = MutationContext("kb19_relu", 0, 1)
    for kind, parent in (("genesis", None), ("optimize", seed), ("repair", broken)):
        f, steps = prompt_fields(kind, parent, ctx, provider=prov, n_inspirations=0, attempts_text=lambda k: "",
                                 feedback=None, failure=lambda m: ("compile", "compile_error", "x"))
        system, user = render_prompt(kind, **f)
        assert info.card in system["content"], kind
        assert ("## An example kernel" in user["content"]) == (kind == "genesis"), kind
        assert "the CuTe reference card" in [label for label, _ in steps], "droppable when a window is small"
    f["card"] = None
    assert "# CuTe reference card" not in render_prompt("repair", **f)[0]["content"]
