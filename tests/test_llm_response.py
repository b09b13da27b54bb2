"""Response handling: reasoning kept out of the answer, answers cut inside their reasoning,
and the bandit's credit (gain per dollar with a relative floor, repair baselines)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from evo.core.records import Candidate, Member, Status
from mutators.base import MutationContext
from mutators.llm.replay.cassette import Cassette
from mutators.llm.client.chat import LLMClient
from mutators.llm.client.model_spec import ModelSpec
from mutators.llm.replay.fake_server import FakeLLMServer
from mutators.llm.bandit import ModelBandit
from mutators.llm.mutator import LLMMutator
from mutators.llm.prompt.context import SimpleContextProvider, TaskInfo
from mutators.llm.answer.patch import Block, render_blocks, strip_reasoning

FIX = Path(__file__).parent / "fixtures" / "llm"
GOOD = (FIX / "tiny_kernel.cu").read_text()
TASK = "tiny_copy"
INFO = TaskInfo(reference_src="def reference(x):\n    return x.clone()", abi_text="// abi", shapes_text="- N=8",
                dtype="float32", tolerance_text="exact")
PATCH = render_blocks([Block("  if (i < n) d(i) = s(i);\n", "  if (i < n) d(i) = s(i) + 0.0f;\n")])
PARENT = Member(candidate=Candidate.create(TASK, GOOD, {}, operator="seed"), fitness=1.0)


@pytest.mark.parametrize("text, answer, cut", [
    ("<think>plan\nmore</think>\nANSWER", "ANSWER", False),
    ("<THINK>a</THINK>x<think>b</think>y", "xy", False),
    ("<thinking>t</thinking>\nA", "A", False),
    ("reasoning the template opened\n</think>\n\nA", "\nA", False),
    ("A <think> cut mid-thought", "A ", True),
    ("plain answer", "plain answer", False),
])
def test_strip_reasoning(text, answer, cut):
    out, note = strip_reasoning(text)
    assert out == answer and bool(note) is cut


def _rig(entries, **spec_kw):
    srv = FakeLLMServer(Cassette(entries)).start()
    spec = ModelSpec("m", srv.base_url, "m", key_env="EVO_TEST_NO_KEY", price_in_per_mtok=1.0, **spec_kw)
    attempts = []
    mut = LLMMutator(LLMClient(timeout_s=5, max_attempts=1), [spec], SimpleContextProvider({TASK: INFO}),
                     attempt_sink=attempts.append)
    return srv, mut, attempts


@pytest.mark.parametrize("stream", [False, True])
def test_a_patch_after_a_think_block_is_used_and_the_reasoning_is_not(stream):
    thought = "<think>\nSEARCH blocks must match. Let me write\n<<<<<<< SEARCH\nbogus\n=======\nx\n>>>>>>> REPLACE\n</think>\n"
    srv, mut, attempts = _rig([{"response": thought + PATCH, "reasoning": "separate reasoning text"}], stream=stream)
    try:
        prop = mut.propose([PARENT], MutationContext(TASK, 0, 1), random.Random(0))
    finally:
        srv.stop()
    assert prop is not None and "s(i) + 0.0f" in prop.source and "bogus" not in prop.source
    assert attempts[0].ok


@pytest.mark.parametrize("entry, expect", [
    ({"response": "<think>I will first consider the tile sizes and", "finish_reason": "length"},
     "unclosed <think> block"),
    ({"response": "", "reasoning": "r" * 200, "finish_reason": "length", "tokens_out": 4096},
     "spent its output tokens (4096, "),
    ({"response": ""}, "empty answer"),
])
def test_answers_cut_inside_their_reasoning_say_so(entry, expect):
    srv, mut, attempts = _rig([entry])
    try:
        assert mut.propose([PARENT], MutationContext(TASK, 0, 1), random.Random(0)) is None
    finally:
        srv.stop()
    assert any(expect in p for p in attempts[0].problems), attempts[0].problems


# ---- the bandit ----------------------------------------------------------------------------------


def _arms(*prices):
    return [ModelSpec(f"m{i}", "http://127.0.0.1:9/v1", f"m{i}", price_in_per_mtok=p) for i, p in enumerate(prices)]


def _simulate(b: ModelBandit, per_pull: dict[str, tuple[float, float]], n=300, seed=0) -> dict[str, int]:
    """``per_pull``: arm -> (mean gain, cost) per pull; gains are noisy (exponential)."""
    rng, noise = random.Random(seed), random.Random(seed + 1)
    counts = {k: 0 for k in per_pull}
    for _ in range(n):
        m = b.choose(rng)
        counts[m.name] += 1
        gain, cost = per_pull[m.name]
        b.update(m, noise.expovariate(1 / gain) if gain > 0 else 0.0, cost)
    return counts


def test_a_free_model_with_little_gain_does_not_take_the_pulls():
    """The measured case: free 0.32 gain over 213 of 300 pulls vs paid 7.4 over 87 (old $0.0001 floor)."""
    per_pull = {"m0": (0.32 / 213, 0.0), "m1": (7.4 / 87, 0.01)}
    counts = _simulate(ModelBandit(_arms(0.0, 1.0)), per_pull)
    assert counts["m1"] > 2 * counts["m0"], counts
    old_floor = _simulate(ModelBandit(_arms(0.0, 1.0), floor_fraction=0.0), per_pull)
    assert old_floor["m0"] > old_floor["m1"], "with only the absolute floor the free model wins (the bug)"


def test_a_free_model_that_gains_comparably_is_preferred():
    per_pull = {"m0": (0.06, 0.0), "m1": (0.085, 0.01)}  # 70% of the paid gain, for nothing
    counts = _simulate(ModelBandit(_arms(0.0, 1.0)), per_pull)
    assert counts["m0"] > counts["m1"], counts


def test_floor_follows_the_typical_priced_call():
    b = ModelBandit(_arms(0.0, 1.0))
    assert b.floor() == pytest.approx(1e-4)
    b.update("m1", 0.1, 0.02)
    b.update("m1", 0.1, 0.04)
    b.update("m0", 0.1, 0.0)
    assert b.floor() == pytest.approx(0.25 * 0.03)
    r = b.rates()
    assert r["m0"] == pytest.approx(0.1 / 0.0075) and r["m1"] == pytest.approx(0.2 / 0.06)


def test_repair_is_credited_with_the_gain_over_the_last_correct_ancestor():
    broken = Member(candidate=Candidate.create(TASK, GOOD.replace("BLOCK +", "BLOK +"), {}, operator="llm:m",
                                               parents=("p",)), fitness=None, status=Status.COMPILE_ERROR)
    prov = SimpleContextProvider({TASK: INFO}, histories={broken.id: [(0, 1.0), (1, 1.2), (2, None)]},
                                 failures={broken.id: ("compile", "compile_error", "error: BLOK")})
    fix = render_blocks([Block("  int64_t i = int64_t(blockIdx.x) * BLOK + threadIdx.x;\n",
                               "  int64_t i = int64_t(blockIdx.x) * BLOCK + threadIdx.x;\n")])
    with FakeLLMServer(Cassette([{"response": fix, "tokens_in": 1000, "tokens_out": 0}])) as srv:
        spec = ModelSpec("m", srv.base_url, "m", key_env="EVO_TEST_NO_KEY", price_in_per_mtok=10.0)
        mut = LLMMutator(LLMClient(timeout_s=5, max_attempts=1), [spec], prov)
        prop = mut.propose([broken], MutationContext(TASK, 0, 3), random.Random(0))
    from evo.core.records import candidate_id, canonical_params

    mut.observe(candidate_id(prop.source, canonical_params(prop.params), TASK), 1.3)
    st = mut.bandit.stats()["m"]
    assert st["gain"] == pytest.approx(0.1) and st["cost"] == pytest.approx(0.01)
