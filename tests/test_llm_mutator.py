"""LLMMutator end to end against the fake endpoint on 127.0.0.1 through the real openai client.

Every bad input (prose, broken blocks, empty answer, whole-file rewrite, oversized answer, a
hanging endpoint, 500s, invalid JSON) must yield a recorded failed attempt and ``None``,
never an exception; 429 with Retry-After waits and succeeds.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from evo.core.records import Candidate, Member, Status
from mutators.base import MutationContext, Mutator, Proposal
from mutators.llm.replay.cassette import Cassette, ReplayClient
from mutators.llm.client.budget import Budget, BudgetExhausted
from mutators.llm.client.calls import LLMCall
from mutators.llm.client.chat import LLMClient
from mutators.llm.client.model_spec import ModelSpec
from mutators.llm.replay.fake_server import FakeLLMServer
from mutators.llm.attempts import AttemptRecord
from mutators.llm.bandit import ModelBandit
from mutators.llm.mutator import LLMMutator
from mutators.llm.prompt.context import SimpleContextProvider, TaskInfo
from mutators.llm.prompt.text import failing_lines, trim_error
from mutators.llm.answer.patch import render_blocks, Block
from mutators.llm.prompt.templates import PromptError, render_prompt, template_fields

FIX = Path(__file__).parent / "fixtures"
GOOD = (FIX / "llm" / "tiny_kernel.cu").read_text()
BAD = GOOD.replace("int64_t(blockIdx.x) * BLOCK", "int64_t(blockIdx.x) * BLOK")
ABI = (Path(__file__).parents[1] / "evaluators" / "abi" / "evo_abi.h").read_text()
TASK = "tiny_copy"
INFO = TaskInfo(
    reference_src="def reference(x):\n    return x.clone()",
    abi_text=ABI,
    shapes_text="- {N: 1048576}\n- {N: 1000}",
    dtype="float32",
    tolerance_text="exact (a copy)",
    sol_text="N=1M: 8 MiB moved, 2.1 us at 4 TB/s",
)
COMPILE_ERR = 'kernel.cu(16): error: identifier "BLOK" is undefined\n1 error detected in the compilation of "kernel.cu".'
PATCH = render_blocks([Block("  if (i < n) d(i) = s(i);\n", "  if (i < n) d(i) = s(i) + 0.0f;\n")])


def member(source: str, fitness: float | None, *, status=Status.OK, error="", gen=1, params=None) -> Member:
    cand = Candidate.create(TASK, source, params or {}, operator="llm:fake", generation=gen)
    return Member(candidate=cand, fitness=fitness, status=status, error=error)


BROKEN = member(BAD, None, status=Status.COMPILE_ERROR, error=COMPILE_ERR)
FIXED = member(GOOD, 1.5, gen=2, params={"BLOCK": "256"})


class Rig:
    """A fake server + real client + mutator, with every sink recorded."""

    def __init__(self, entries, *, timeout_s=1.0, max_attempts=2, budget=None, provider=None, models=None,
                 max_response_bytes=64 * 1024, **mut_kw):
        self.server = FakeLLMServer(Cassette(entries)).start()
        self.calls: list[LLMCall] = []
        self.attempts: list[AttemptRecord] = []
        self.client = LLMClient(timeout_s=timeout_s, max_attempts=max_attempts, backoff_base_s=0.01,
                                backoff_max_s=0.02, rng=random.Random(1), budget=budget, sink=self.calls.append,
                                max_response_bytes=max_response_bytes)
        self.models = models or [ModelSpec("fake", self.server.base_url, "fake-coder", key_env="EVO_TEST_NO_KEY",
                                           price_in_per_mtok=1.0, price_out_per_mtok=4.0)]
        self.provider = provider or SimpleContextProvider(
            {TASK: INFO},
            failures={BROKEN.id: ("compile", "compile_error", COMPILE_ERR)},
            histories={FIXED.id: [(1, None), (2, 1.5)]},
            inspirations={(TASK, 0): [(GOOD.replace("tiny_copy_kernel", "other_kernel"), 2.25)]},
        )
        self.mut = LLMMutator(self.client, self.models, self.provider, attempt_sink=self.attempts.append, **mut_kw)

    def propose(self, parents, seen=frozenset(), island=0):
        return self.mut.propose(parents, MutationContext(TASK, island, 3, seen), random.Random(0))

    def prompt(self, i=-1) -> str:
        return self.server.requests[i]["messages"][-1]["content"]

    def close(self):
        self.server.stop()


@pytest.fixture
def rig_factory():
    rigs = []

    def make(entries, **kw):
        r = Rig(entries, **kw)
        rigs.append(r)
        return r

    yield make
    for r in rigs:
        r.close()


def test_is_a_mutator(rig_factory):
    assert isinstance(rig_factory([]).mut, Mutator)


# ---- happy paths ---------------------------------------------------------------------------


def test_genesis_repair_optimize_from_the_fixture_cassette(rig_factory):
    entries = Cassette.load(FIX / "llm" / "lineage.jsonl").entries
    rig = rig_factory(entries)
    g = rig.propose([])
    assert isinstance(g, Proposal) and g.source == BAD and g.parents == () and g.operator == "llm:fake"
    p = rig.prompt()
    assert p.startswith("[kind:genesis] task tiny_copy") and "return x.clone()" in p and "EVO_ABI_VERSION" in p
    assert "2.1 us at 4 TB/s" in p and "```cuda" in p
    assert "evaluation contract" in rig.server.requests[-1]["messages"][0]["content"]

    r = rig.propose([BROKEN])
    assert r is not None and r.source == GOOD and r.parents == (BROKEN.id,)
    p = rig.prompt()
    assert p.startswith("[kind:repair]") and "`compile`" in p and 'identifier "BLOK"' in p
    assert ">>   16 |   int64_t i = int64_t(blockIdx.x) * BLOK" in p  # the failing line, numbered
    assert "<<<<<<< SEARCH" in p

    o = rig.propose([FIXED])
    assert o is not None and "__launch_bounds__(BLOCK)" in o.source
    assert o.params == {"BLOCK": "256"}  # the parent's tunable values carry over
    p = rig.prompt()
    assert p.startswith("[kind:optimize]") and "1.500x" in p and "generation 1: incorrect" in p
    assert "Inspiration 1 (speedup 2.250)" in p and "other_kernel" in p
    assert "Profile" not in p  # no profile metrics were passed
    assert [a.ok for a in rig.attempts] == [True, True, True]
    assert [c.kind for c in rig.calls] == ["genesis", "repair", "optimize"]
    assert rig.attempts[2].candidate_id and rig.calls[2].prompt_hash == rig.attempts[2].prompt_hash


def test_optimize_shows_profile_only_when_provided(rig_factory):
    prov = SimpleContextProvider({TASK: INFO}, profiles={FIXED.id: {"dram_throughput_pct": 61.25, "registers": 24}})
    rig = rig_factory([{"response": PATCH, "repeat": True}], provider=prov)
    assert rig.propose([FIXED]) is not None
    p = rig.prompt()
    assert "## Profile of the current kernel" in p and "dram_throughput_pct: 61.25" in p and "registers: 24" in p
    other = member(GOOD.replace("tiny_copy_kernel", "k2"), 1.2)
    assert rig.propose([other]) is not None
    assert "Profile" not in rig.prompt()
    assert "Inspiration" not in rig.prompt()  # none were available


def test_429_with_retry_after_waits_and_succeeds(rig_factory):
    rig = rig_factory([{"status": 429, "retry_after": 0.3}, {"response": PATCH}])
    t = time.monotonic()
    prop = rig.propose([FIXED])
    assert prop is not None and time.monotonic() - t >= 0.28
    assert rig.calls[0].attempts == 2 and rig.calls[0].ok


# ---- bad input: each is a recorded failed attempt and None --------------------------------------


@pytest.mark.parametrize(
    "entries, parent, expect",
    [
        ([{"response": "You should use vectorized loads and more threads per block."}], FIXED, "prose only"),
        ([{"response": "<<<<<<< SEARCH\n  if (i < n) d(i) = s(i);\n=======\n  x\n"}], FIXED, "broken SEARCH/REPLACE block"),
        ([{"response": ""}], FIXED, "empty answer"),
        ([{"response": "Here is a better file:\n```cuda\n" + GOOD + "// notes\n" * 45 + "```\n"}], FIXED,
         "lines (at most 40 are accepted as a patch)"),
        ([{"response": "```cuda\n" + BAD.replace("#endif\n", "#endif\n" + "// padding\n" * 41) + "```"}], BROKEN,
         "whole-file rewrite"),
        ([{"response": "no code for you"}], None, "no ```cuda file"),
        ([{"response": render_blocks([Block("  if (i < n) d(i) = s(i);\n", "    if (i < n) d(i) = s(i);\n")])}], FIXED,
         "no-op"),
        ([{"response": render_blocks([Block('#include "evo_abi.h"\n', "")])}], FIXED, "evo_abi.h"),
        ([{"response": render_blocks([Block("                          const double* scalars, int n_scalars, cudaStream_t stream) {\n",
                                            "                          const double* scalars, cudaStream_t stream) {\n")])}],
         FIXED, "signature changed"),
        ([{"response": "x" * 100_000}], FIXED, "response too large"),
        ([{"status": 500, "repeat": True}], FIXED, "HTTP 500"),
        ([{"raw": "{\"choices\": [", "repeat": True}], FIXED, "invalid JSON"),
        ([{"delay_s": 10, "repeat": True}], FIXED, "timeout"),
    ],
    ids=["prose", "broken-blocks", "empty", "whole-file-optimize", "whole-file-repair", "genesis-prose", "no-op",
         "abi-include", "abi-signature", "enormous", "500s", "invalid-json", "hang"],
)
def test_bad_answers_are_recorded_failed_attempts(rig_factory, entries, parent, expect):
    rig = rig_factory(entries, timeout_s=0.3)
    t = time.monotonic()
    prop = rig.propose([parent] if parent is not None else [])
    assert prop is None
    assert time.monotonic() - t < 5
    (att,) = rig.attempts
    assert not att.ok and any(expect in p for p in att.problems), att.problems
    assert rig.mut.last_failure == att
    assert len(rig.calls) == 1 and att.prompt_hash == rig.calls[0].prompt_hash
    if expect in ("HTTP 500", "invalid JSON", "timeout", "response too large"):
        assert rig.calls[0].error is not None and att.call_error == rig.calls[0].error


def test_mutator_caps_answers_even_from_a_lenient_client(rig_factory):
    rig = rig_factory([{"response": PATCH + "\n" + "// padding\n" * 500}], max_response_kb=2,
                      max_response_bytes=1 << 20)
    assert rig.propose([FIXED]) is None
    assert "answer too large" in rig.attempts[0].problems[0]


def test_unmatched_blocks_are_reported_in_the_next_prompt_for_that_parent(rig_factory):
    wrong = render_blocks([Block("  if (j < n) d(j) = s(j);\n", "  if (j < n) d(j) = 2 * s(j);\n")])
    rig = rig_factory([{"response": wrong}, {"response": PATCH}, {"response": PATCH.replace("0.0f", "1.0f")}])
    assert rig.propose([FIXED]) is None
    att = rig.attempts[0]
    assert "matched nowhere" in att.problems[0] and att.unmatched[0].search_text.startswith("  if (j < n)")
    assert "if (i < n) d(i) = s(i);" in att.unmatched[0].closest_match_snippet
    assert rig.mut.unmatched_for(FIXED.id)

    assert rig.propose([FIXED]) is not None
    p = rig.prompt()
    assert "## Your previous answer was not used" in p and "if (j < n) d(j) = s(j);" in p
    assert "closest lines in the source (from line 17)" in p
    assert not rig.mut.unmatched_for(FIXED.id)  # cleared once a patch from that parent applied
    assert rig.propose([FIXED]) is not None
    assert "## Your previous answer was not used" not in rig.prompt()
    assert "attempt 1 (fake): rejected before compiling: 1 of 1 SEARCH blocks matched nowhere" in rig.prompt()


def test_duplicate_child_is_rejected(rig_factory):
    rig = rig_factory([{"response": PATCH, "repeat": True}])
    first = rig.propose([FIXED])
    from evo.core.records import candidate_id, canonical_params

    seen = frozenset({candidate_id(first.source, canonical_params(first.params), TASK)})
    assert rig.propose([FIXED], seen=seen) is None
    assert "duplicate" in rig.attempts[-1].problems[0]


def test_budget_exhaustion_stops_calls(rig_factory):
    budget = Budget(max_usd=0.05)
    rig = rig_factory([{"response": PATCH, "tokens_in": 1000, "tokens_out": 8000, "repeat": True}], budget=budget)
    # $1/Mtok in, $4/Mtok out: a call costs $0.033; its worst case (the prompt counted high plus
    # 8192 output tokens, ~$0.036) fits the budget once, not after one call was paid
    assert rig.propose([FIXED]) is not None
    with pytest.raises(BudgetExhausted):
        rig.propose([FIXED])
    assert len(rig.server.requests) == 1 and len(rig.calls) == 1


# ---- replay -----------------------------------------------------------------------------------


def test_replay_reproduces_proposals_without_endpoint(rig_factory):
    entries = Cassette.load(FIX / "llm" / "lineage.jsonl").entries
    rig = rig_factory(entries)
    live = [rig.propose([]), rig.propose([BROKEN]), rig.propose([FIXED])]
    rows = [c.to_row() for c in rig.calls]
    rig.close()
    replay_calls: list[LLMCall] = []
    mut = LLMMutator(ReplayClient(rows, sink=replay_calls.append), rig.models, rig.provider)
    again = [mut.propose(p, MutationContext(TASK, 0, 3), random.Random(0)) for p in ([], [BROKEN], [FIXED])]
    assert again == live
    assert all(c.cached for c in replay_calls)
    assert json.loads(rows[0]["prompt"])[1]["content"].startswith("[kind:genesis]")


# ---- bandit -------------------------------------------------------------------------------------


def _models(*weights):
    return [ModelSpec(f"m{i}", "http://127.0.0.1:9/v1", f"m{i}", weight=w) for i, w in enumerate(weights)]


def test_bandit_prior_follows_weights_and_zero_weight_is_off():
    b = ModelBandit(_models(1.0, 3.0, 0.0))
    rng = random.Random(0)
    picks = [b.choose(rng).name for _ in range(30)]
    assert picks[0] == "m1" and "m2" not in picks
    # no rewards yet: proposals follow the weights (about 3:1)
    assert 2.0 <= picks.count("m1") / picks.count("m0") <= 4.5


def test_bandit_shifts_to_the_model_that_pays_off():
    b = ModelBandit(_models(1.0, 1.0))
    rng = random.Random(3)
    counts = {"m0": 0, "m1": 0}
    for _ in range(200):
        m = b.choose(rng)
        counts[m.name] += 1
        # m1 improves fitness by 0.2 for $0.01; m0 never improves
        b.update(m, 0.2 if m.name == "m1" else 0.0, 0.01)
    assert counts["m1"] > 3 * counts["m0"]
    assert b.stats()["m1"]["gain"] > 0 == b.stats()["m0"]["gain"]


def test_bandit_reward_is_per_dollar():
    b = ModelBandit(_models(1.0, 1.0), cost_floor_usd=0.0)
    rng = random.Random(0)
    for _ in range(100):
        m = b.choose(rng)
        # same improvement, m0 ten times dearer
        b.update(m, 0.1, 0.10 if m.name == "m0" else 0.01)
    s = b.stats()
    assert s["m1"]["pulls"] > s["m0"]["pulls"]


def test_observe_feeds_the_bandit(rig_factory):
    rig = rig_factory([{"response": PATCH}])
    prop = rig.propose([FIXED])
    from evo.core.records import candidate_id, canonical_params

    cid = candidate_id(prop.source, canonical_params(prop.params), TASK)
    rig.mut.observe(cid, 2.0)
    assert rig.mut.bandit.stats()["fake"]["gain"] > 0
    rig.mut.observe("unknown-id", 3.0)  # ignored


def test_bandit_rejects_all_zero_weights():
    with pytest.raises(ValueError, match="weight > 0"):
        ModelBandit(_models(0.0))


# ---- prompts and helpers --------------------------------------------------------------------------


def test_render_prompt_errors_name_the_problem():
    with pytest.raises(PromptError, match="known kinds: genesis, repair, optimize"):
        render_prompt("refactor")
    with pytest.raises(PromptError, match="needs field\\(s\\) .*reference_src"):
        render_prompt("genesis", task="t", abi_text="", dtype="f", shapes_text="", tolerance_text="")


def test_template_fields():
    req, opt = template_fields("optimize")
    assert {"parent_source", "history_text", "parent_fitness"} <= req
    assert {"profile", "inspirations", "attempts", "feedback", "sol_text", "tunables", "timings", "ptxas",
            "omitted", "description", "tensors_text"} <= opt
    req, opt = template_fields("repair")
    assert {"stage", "status", "error_text"} <= req and "failing_lines" in opt


def test_failing_lines_and_trim():
    out = failing_lines(BAD, COMPILE_ERR)
    assert ">>   16 |" in out and "   15 |" in out
    hdr = "/usr/include/cute/tensor.hpp(12): error: x\nkernel.cu:17:3: error: y"
    out = failing_lines(BAD, hdr)  # the header location is skipped, the candidate's is shown
    assert ">>   17 |" in out and out.count(">>") == 1
    assert ">>   17 |" in failing_lines(BAD, "kernel.cu:17:3: error: y")
    assert failing_lines(BAD, "policy: forbidden call at line 20") .count(">>") == 1
    long = "\n".join(f"e{i}" for i in range(100))
    assert trim_error(long, max_lines=5).endswith("[... trimmed ...]")
