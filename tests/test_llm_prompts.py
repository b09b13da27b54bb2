"""Prompt content: what a repair and an optimize prompt show, that tunable edits take
effect, compile errors with the candidate's own lines first, the context budget, and the
full example prompts of docs/llm.md (rendered from real task data, a real seed, a real
ptxas report and a real nvcc log; regenerate with EVO_WRITE_DOCS=1)."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import pytest

from evo.engine.llm_context import StoreContextProvider, ptxas_text, task_info
from evo.core.records import Candidate, Evaluation, Member, StageResult, Status
from evo.store import Store
from mutators.base import MutationContext
from mutators.llm.replay.cassette import Cassette
from mutators.llm.client.chat import LLMClient
from mutators.llm.client.model_spec import ModelSpec
from mutators.llm.replay.fake_server import FakeLLMServer
from mutators.llm.mutator import LLMMutator
from mutators.llm.prompt.context import ParentFacts, ShapeTiming, SimpleContextProvider, TaskInfo
from mutators.llm.answer.patch import Block, render_blocks

FIX = Path(__file__).parent / "fixtures" / "llm"
KERNELS = Path(__file__).parents[1] / "evo" / "tasks" / "kernels"
DOCS = Path(__file__).parents[1] / "docs" / "llm.md"
MATVEC = (FIX / "parent_matvec.cu").read_text()
RANKS_SRC = (FIX / "matvec_mismatched_ranks.cu").read_text()
RANKS_LOG = (FIX / "nvcc_cute_mismatched_ranks.log").read_text()
COMPILE_OK = json.loads((FIX / "matvec_compile_ok.json").read_text())
TASK = "kb04_matvec"
MANGLED = "_ZN8evo_seed13matvec_kernelILi4EEEvPKfS2_Pfll"


@pytest.fixture(scope="module")
def info() -> TaskInfo:
    return task_info(TASK, "H200")


# ---- task facts -----------------------------------------------------------------------------------


def test_task_info_has_constants_description_and_tensors():
    rms = task_info("rmsnorm_bf16", "H200")
    assert rms.reference_src.startswith("# module-level constants the reference uses\nRMSNORM_EPS = 1e-06\n")
    assert "def rmsnorm(" in rms.reference_src
    assert "in[1] `weight`: bfloat16 [H]" in rms.tensors_text and "out[0]: bfloat16 [R, H]" in rms.tensors_text
    assert "scalars: [1e-06]" in rms.tensors_text
    ta = task_info("kb16_trans_a", "H200")
    assert "stored [K,M]" in ta.description and "in[0] `A`: float32 [K, M]" in ta.tensors_text
    sym = task_info("kb13_symmetric", "H200")
    assert "symmetric" in sym.description and "symmetric), contiguous" in sym.tensors_text
    gelu = task_info("gemm_bias_gelu_bf16", "H200")
    assert "def gelu(" not in gelu.reference_src, "F.gelu is an attribute, not the module's gelu helper"


def _stages(fitness=1.22):
    comp = StageResult("compile", Status.OK, metrics=COMPILE_OK["metrics"], artifacts={"ptxas": COMPILE_OK["ptxas"]})
    timing = StageResult("timing", Status.OK, metrics={"shapes": [
        {"shape": {"M": 2048, "K": 1048576}, "median_ms": 1.9316, "ref_median_ms": 2.3573, "pct_sol": 92.7}],
        "fitness": fitness})
    return (StageResult("policy", Status.OK), comp, StageResult("correctness", Status.OK), timing)


def test_parent_facts_read_times_ptxas_and_the_readable_profile_from_the_store(tmp_path):
    with Store(tmp_path / "e.db") as store:
        run = store.create_run("ctx", {}, seed=0, config_hash="x")
        seed = Candidate.create(TASK, MATVEC, {}, operator="seed")
        child = Candidate.create(TASK, MATVEC + "// c\n", {}, parents=(seed.id,), operator="llm:m", generation=1)
        for c in (seed, child):
            store.add_candidate(run, c)
            store.add_evaluation(run, Evaluation(c.id, _stages(), 1.22))
            store.add_profile(c.id, shape="M=2048 K=1048576", gpu="H200", metrics={
                "kernel": MANGLED, "bound": "memory", "duration_ns": 1.9e6, "dram_throughput_pct": 91.0})
        prov = StoreContextProvider(store, run, feedback_after=1)
        seed_facts, child_facts = prov.parent_facts(seed.id), prov.parent_facts(child.id)
        bad = Candidate.create(TASK, RANKS_SRC, {}, parents=(seed.id,), operator="llm:m")
        store.add_candidate(run, bad)
        store.add_evaluation(run, Evaluation(bad.id, (StageResult("policy", Status.OK), StageResult(
            "compile", Status.COMPILE_ERROR, "nvcc failed", artifacts={
                "log": RANKS_LOG, "errors": (FIX / "nvcc_cute_mismatched_ranks.errors").read_text()})))),
        assert prov.failure(bad.id) == ("compile", "compile_error", RANKS_LOG), "the full log, not the cut excerpt"
    assert seed_facts.timings == (ShapeTiming("M=2048 K=1048576", 1.9316, 2.3573, 92.7),)
    assert "evo_seed::matvec_kernel<4>: 125 registers/thread, 64 B static shared memory, 0 B spill stores" \
           in seed_facts.ptxas
    assert seed_facts.profile_text == "", "lineage depth 0 < feedback_after 1: no profile yet"
    assert child_facts.profile_text.startswith("Nsight Compute profile (memory; kernel evo_seed::matvec_kernel<4>")
    assert MANGLED not in child_facts.profile_text and "DRAM 91.0%" in child_facts.profile_text


# ---- what the prompts show --------------------------------------------------------------------------


class Rig:
    def __init__(self, entries, provider, **spec_kw):
        self.server = FakeLLMServer(Cassette(entries)).start()
        self.spec = ModelSpec("m", self.server.base_url, "m", key_env="EVO_TEST_NO_KEY", **spec_kw)
        self.attempts = []
        self.mut = LLMMutator(LLMClient(timeout_s=5, max_attempts=1), [self.spec], provider,
                              attempt_sink=self.attempts.append)

    def go(self, parent, island=0):
        return self.mut.propose([parent], MutationContext(TASK, island, 2), random.Random(0))

    def prompt(self, i=-1):
        return self.server.requests[i]["messages"][-1]["content"]


@pytest.fixture
def rig():
    made = []

    def make(*a, **kw):
        r = Rig(*a, **kw)
        made.append(r)
        return r

    yield make
    for r in made:
        r.server.stop()


PARAMS = {"BLOCK": "512", "VEC": "4", "UNROLL": "2", "ROWS": "2"}
PARENT = Member(candidate=Candidate.create(TASK, MATVEC, PARAMS, operator="seed"), fitness=1.22)
FACTS = ParentFacts((ShapeTiming("M=2048 K=1048576", 1.9316, 2.3573, 92.7),), ptxas_text(COMPILE_OK["metrics"]),
                    "Nsight Compute profile (memory; kernel evo_seed::matvec_kernel<4>):\n- duration 1931.60 us")


def test_optimize_prompt_shows_what_the_model_needs(rig, info):
    other = MATVEC.replace("#define UNROLL 4", "#define UNROLL 8").replace("UNROLL = 4 in", "UNROLL = 8 in")
    prov = SimpleContextProvider({TASK: info}, histories={PARENT.id: [(0, 1.22)]}, facts={PARENT.id: FACTS},
                                 inspirations={(TASK, 0): [(other, 1.31, {"BLOCK": "256"})]})
    r = rig([{"response": "no"}], prov)
    r.go(PARENT)
    p = r.prompt()
    for needle in ("## Task\nMatrix-vector: C[M,1] = A[M,K] @ B[K,1]", "def matmul(A: torch.Tensor, B: torch.Tensor)",
                   "in[0] `A`: float32 [M, K]", "out[0]: float32 [M, 1]",
                   "- BLOCK = 512 (allowed: 128, 256, 512, 1024)", "- UNROLL = 2 (allowed: 1, 2, 4, 8)",
                   "| M=2048 K=1048576 | 1.9316 | 2.3573 | 1.220x | 92.7% |",
                   "- evo_seed::matvec_kernel<4>: 125 registers/thread", "kernel evo_seed::matvec_kernel<4>",
                   "### Inspiration 1 (speedup 1.310): its difference from the current kernel", "```diff"):
        assert needle in p, needle
    # the parent as it ran: its -D values are the defaults shown
    assert "// @tunable BLOCK = 512 in {128, 256, 512, 1024}" in p and "#define BLOCK 512" in p
    assert "#define BLOCK 256" not in p.split("## Kernel (current source)")[1].split("## Tunables")[0]


def test_dissimilar_inspiration_is_shown_as_its_body_without_the_header(rig, info):
    tiny = (FIX / "tiny_kernel.cu").read_text()
    prov = SimpleContextProvider({TASK: info}, inspirations={(TASK, 0): [(tiny, 1.5)]})
    r = rig([{"response": "no"}], prov)
    r.go(PARENT)
    p = r.prompt()
    assert "its source without the header comment\n```cuda\n#include <cute/tensor.hpp>" in p
    assert "tiny_kernel.cu -- the smallest" not in p


def test_a_patch_that_edits_a_tunable_default_takes_effect(rig, info):
    edit = render_blocks([Block("// @tunable BLOCK = 512 in {128, 256, 512, 1024}\n",
                                "// @tunable BLOCK = 1024 in {128, 256, 512, 1024}\n"),
                          Block("#define BLOCK 512\n", "#define BLOCK 1024\n")])
    other = render_blocks([Block("  const int64_t kv = k / V;\n", "  const int64_t kv = k / int64_t(V);\n")])
    r = rig([{"response": edit}, {"response": other}], SimpleContextProvider({TASK: info}))
    a = r.go(PARENT)
    assert a.params["BLOCK"] == "1024", "before: the parent's -DBLOCK=512 silently overrode the edit"
    assert a.params == {**PARAMS, "BLOCK": "1024"}
    b = r.go(PARENT)
    assert b.params == PARAMS, "untouched tunables keep the parent's values"


def test_repair_prompt_has_the_candidates_own_lines_first(rig, info):
    broken = Member(candidate=Candidate.create(TASK, RANKS_SRC, {}, parents=(PARENT.id,), operator="llm:m"),
                    fitness=None, status=Status.COMPILE_ERROR)
    prov = SimpleContextProvider({TASK: info}, failures={broken.id: ("compile", "compile_error", RANKS_LOG)})
    r = rig([{"response": "no"}], prov)
    r.go(broken)
    p = r.prompt()
    err = p.split("## Failure")[1].split("## The kernel's lines")[0]
    assert err.index("in your kernel at lines 88, 163") < err.index("stride.hpp")
    assert "candidate.cu(88) [innermost]" in err and "candidate.cu(163) [outermost]" in err
    assert "Mismatched Ranks" in err and "at line 241 of" not in err, "header frames are counted, not listed"
    lines = p.split("## The kernel's lines the errors point at")[1].split("```")[1]
    assert re.findall(r">>\s+(\d+) \|", lines) == ["88", "163"], "only the kernel's own lines are marked"
    assert "def matmul(" in p, "the reference is in repair prompts too"


def test_context_budget_trims_least_useful_first_and_says_so(rig, info):
    big = (KERNELS / "gemm_f32.cu").read_text()
    prov = SimpleContextProvider({TASK: info}, facts={PARENT.id: FACTS}, histories={PARENT.id: [(0, 1.0)] * 9},
                                 inspirations={(TASK, 0): [(big, 2.0), (big.replace("BM", "BMX"), 1.9)]})
    ctx = MutationContext(TASK, 0, 2)
    probe = Rig([], prov)
    full = probe.mut.render("optimize", PARENT, ctx, probe.spec, chain=PARENT.id)
    probe.server.stop()
    assert full.fits and not full.omitted
    r = rig([{"response": "no"}], prov, context_tokens=full.tokens - 6000 + 4096, max_output_tokens=4096)
    fitted = r.mut.render("optimize", PARENT, ctx, r.spec, chain=PARENT.id)
    assert fitted.fits and fitted.tokens <= fitted.budget and fitted.omitted[:2] == (
        "one kernel of another island", "one kernel of another island")
    text = fitted.messages[-1]["content"]
    assert "## Left out to fit the model's context window\none kernel of another island" in text
    assert "### Inspiration" not in text and "## Kernel (current source)" in text


def test_a_prompt_that_cannot_fit_is_not_sent(rig, info):
    r = rig([{"response": "never"}], SimpleContextProvider({TASK: info}), context_tokens=1500, max_output_tokens=1024)
    assert r.go(PARENT) is None
    assert r.server.requests == [], "nothing was sent"
    (att,) = r.attempts
    assert "prompt too large for model 'm'" in att.problems[0] and "not sent" in att.problems[0]
    assert [s.status for s in r.mut.health.states()] == ["ok"], "an oversized prompt does not stop the model"


def test_the_budget_learns_the_endpoints_characters_per_token(rig, info):
    big = (KERNELS / "gemm_f32_3xtf32.cu").read_text()  # the 1,647-line fp32 GEMM seed, 85 KB
    parent = Member(candidate=Candidate.create(TASK, big, {}, operator="seed"), fitness=1.0)
    r = rig([{"response": "no", "repeat": True}], SimpleContextProvider({TASK: info}), context_tokens=32768,
            max_output_tokens=8192)
    ctx = MutationContext(TASK, 0, 2)
    first = r.mut.render("optimize", parent, ctx, r.spec, chain="a")
    assert first.tokens > first.budget, "3 characters a token: too big"
    assert first.fits, "but not calibrated yet, and it fits at 4.5: sent on trial (tests/test_llm_window.py)"
    r.go(PARENT)  # one call: the fake reports ~4 characters a token
    assert 3.5 < r.mut.chars_per_token("m") < 4.0
    assert r.mut.render("optimize", parent, ctx, r.spec, chain="a").fits


# ---- the example prompts of docs/llm.md -------------------------------------------------------------


def _example_prompts(info: TaskInfo) -> tuple[str, str]:
    """The optimize prompt of the matvec seed and the repair prompt of its 'Mismatched Ranks'
    child, from measured data only (H200 times of benchmarks/results_h200/RESULTS.md, commit
    cbba868; the ptxas report and nvcc log of this CPU machine)."""
    seed = Member(candidate=Candidate.create(TASK, MATVEC, {}, operator="seed"), fitness=1.220)
    broken = Member(candidate=Candidate.create(TASK, RANKS_SRC, {}, parents=(seed.id,), operator="llm:m",
                                               generation=1), fitness=None, status=Status.COMPILE_ERROR)
    facts = ParentFacts((ShapeTiming("M=2048 K=1048576", 1.9316, 2.3573, 92.7),), ptxas_text(COMPILE_OK["metrics"]))
    prov = SimpleContextProvider({TASK: info}, histories={seed.id: [(0, 1.22)]}, facts={seed.id: facts},
                                 failures={broken.id: ("compile", "compile_error", RANKS_LOG)})
    spec = ModelSpec("qwen", "http://127.0.0.1:8000/v1", "Qwen/Qwen3-32B", context_tokens=32768,
                     max_output_tokens=8192)
    mut = LLMMutator(LLMClient(), [spec], prov)
    ctx = MutationContext(TASK, 0, 1)
    opt = mut.render("optimize", seed, ctx, spec, chain=seed.id).messages
    rep = mut.render("repair", broken, ctx, spec, chain=broken.id).messages
    return opt[1]["content"], rep[1]["content"]


def _docs_block(title: str) -> str:
    text = DOCS.read_text()
    m = re.search(rf"<!-- example:{title} -->\n`````text\n(.*?)`````\n<!-- end example -->", text, re.DOTALL)
    assert m, f"docs/llm.md has no <!-- example:{title} --> block"
    return m.group(1)


def test_docs_show_the_current_rendered_prompts(info):
    opt, rep = _example_prompts(info)
    if os.environ.get("EVO_WRITE_DOCS"):
        text = DOCS.read_text()
        for title, body in (("optimize", opt), ("repair", rep)):
            text = re.sub(rf"(<!-- example:{title} -->\n`````text\n).*?(`````\n<!-- end example -->)",
                          lambda m: m.group(1) + body + m.group(2), text, flags=re.DOTALL)
        DOCS.write_text(text)
    assert _docs_block("optimize") == opt, "docs/llm.md's optimize example is stale: rerun with EVO_WRITE_DOCS=1"
    assert _docs_block("repair") == rep, "docs/llm.md's repair example is stale: rerun with EVO_WRITE_DOCS=1"
    system = (Path(__file__).parents[1] / "mutators" / "llm" / "prompt" / "prompts" / "system.md").read_text()
    assert "evaluation contract" in system


# ---- policy rejections: every violation -----------------------------------------------------------


def test_a_repair_prompt_for_a_policy_rejection_lists_every_violation(tmp_path, info):
    """The policy names all violations (artifacts["violations"]); the repair prompt used to
    quote only its reason: the first violation and "(+3 more violations)"."""
    from evaluators.policy import check_policy

    src = MATVEC.replace('#include "evo_abi.h"\n', '#include "evo_abi.h"\n#include <cstdlib>\nstatic int calls = 0;\n')
    src = src.replace("  if (m == 0) return cudaSuccess;\n",
                      '  if (m == 0) return cudaSuccess;\n  if (getenv("EVO_FAST")) system("true");\n')
    pol = check_policy(src)
    assert pol.status is Status.REJECTED and pol.metrics["n_violations"] == 4 and "(+3 more violations)" in pol.reason
    with Store(tmp_path / "e.db") as store:
        run = store.create_run("ctx", {}, seed=0, config_hash="x")
        bad = Candidate.create(TASK, src, {}, operator="llm:m")
        store.add_candidate(run, bad)
        store.add_evaluation(run, Evaluation(bad.id, (pol,)))
        prov = StoreContextProvider(store, run)
        stage, status, text = prov.failure(bad.id)
        assert (stage, status) == ("policy", "rejected")
        broken = Member(candidate=bad, fitness=None, status=Status.REJECTED)
        spec = ModelSpec("m", "http://127.0.0.1:8000/v1", "m", context_tokens=32768, max_output_tokens=4096)
        rep = LLMMutator(LLMClient(), [spec], SimpleContextProvider({TASK: info}, failures={bad.id: (stage, status, text)}))
        prompt = rep.render("repair", broken, MutationContext(TASK, 0, 1), spec, chain=bad.id).messages[1]["content"]
    err = prompt.split("## Failure")[1].split("## The kernel's lines")[0]
    lines = [v["line"] for v in pol.metrics["violations"]]
    for rule, line in zip(("include-allowlist", "no-global-state", "no-env", "no-host-process"), lines):
        assert f"line {line}: [{rule}]" in err, err
    assert "no-env: the environment is not an input" in err  # each rule's why
    marked = re.findall(r">>\s+(\d+) \|", prompt.split("## The kernel's lines the errors point at")[1].split("```")[1])
    assert sorted(set(int(x) for x in marked)) == sorted(set(lines)), "every violation's line is excerpted"
