"""Every rejection reason goes back to the model in the next prompt for that parent; no
parent gets the same prompt twice in a row; the repair loop's mutator side (offer_repair /
next_repair / repair: rounds, the per-lineage cap, a worse repair is not the next base).

Measured before: 60 repair calls with one prompt hash ($0.66, no evaluation).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from evo.core.records import Candidate, Member, Status, candidate_id, canonical_params
from mutators.base import MutationContext
from mutators.llm.replay.cassette import Cassette
from mutators.llm.client.calls import prompt_hash
from mutators.llm.client.chat import LLMClient
from mutators.llm.client.model_spec import ModelSpec
from mutators.llm.replay.fake_server import FakeLLMServer
from mutators.llm.mutator import LLMMutator
from mutators.llm.prompt.context import SimpleContextProvider, TaskInfo
from mutators.llm.answer.interpret import ORDER_NOTE
from mutators.llm.answer.patch import Block, render_blocks

FIX = Path(__file__).parent / "fixtures" / "llm"
GOOD = (FIX / "tiny_kernel.cu").read_text()
BAD = GOOD.replace("int64_t(blockIdx.x) * BLOCK", "int64_t(blockIdx.x) * BLOK")
TASK = "tiny_copy"
INFO = TaskInfo(reference_src="def reference(x):\n    return x.clone()", abi_text="// abi", shapes_text="- N=8",
                dtype="float32", tolerance_text="exact")
PATCH = render_blocks([Block("  if (i < n) d(i) = s(i);\n", "  if (i < n) d(i) = s(i) + 0.0f;\n")])
PARENT = Member(candidate=Candidate.create(TASK, GOOD, {}, operator="seed"), fitness=1.0)
ERR = 'candidate.cu(16): error: identifier "BLOK" is undefined'


class Rig:
    def __init__(self, entries, failures=None, **kw):
        self.server = FakeLLMServer(Cassette(entries)).start()
        spec = ModelSpec("m", self.server.base_url, "m", key_env="EVO_TEST_NO_KEY")
        self.failures = dict(failures or {})
        self.provider = SimpleContextProvider({TASK: INFO}, failures=self.failures)
        self.attempts = []
        self.mut = LLMMutator(LLMClient(timeout_s=1, max_attempts=1), [spec], self.provider,
                              attempt_sink=self.attempts.append, **kw)

    def propose(self, parent, seen=frozenset(), i=0):
        return self.mut.propose([parent], MutationContext(TASK, 0, 1, seen), random.Random(i))

    def prompts(self):
        return [r["messages"][-1]["content"] for r in self.server.requests]

    def hashes(self):
        return [prompt_hash(r["messages"], "m") for r in self.server.requests]


@pytest.fixture
def rig():
    made = []

    def make(entries, **kw):
        r = Rig(entries, **kw)
        made.append(r)
        return r

    yield make
    for r in made:
        r.server.stop()


BIG_REWRITE = "```cuda\n" + GOOD + "// rewritten\n" * 50 + "```\n"
ELIDED = "```cuda\n" + GOOD.replace("  using namespace cute;\n", "  // ... unchanged ...\n") + "```\n"


@pytest.mark.parametrize("answer, said", [
    ("Use more threads per block.", ["no SEARCH/REPLACE blocks", "<<<<<<< SEARCH"]),
    ("<<<<<<< SEARCH\n  if (i < n) d(i) = s(i);\n=======\n  x\n", ["broken SEARCH/REPLACE markers", ">>>>>>> REPLACE"]),
    (render_blocks([Block("  if (i < n) d(i) = s(i);\n", "  if (i < n)  d(i) = s(i);\n")]), ["changed nothing"]),
    (render_blocks([Block("  d(q) = s(q);\n", "  d(q) = 2 * s(q);\n")]), ["matched nowhere", "closest lines"]),
    (BIG_REWRITE, ["rewrote the whole file (50 changed lines)", "<<<<<<< SEARCH"]),
    (render_blocks([Block('#include "evo_abi.h"\n', "")]), ["broke the kernel ABI", "evo_abi.h"]),
    ("", ["was empty"]),
    (render_blocks([Block("}\n", "}  // end\n")]), ["matches 2 times (exactly), at lines 18 and 31", ORDER_NOTE]),
    (ELIDED, ["'// ... unchanged ...'", "would be deleted", "complete file"]),
], ids=["prose", "broken", "no-op", "unmatched", "whole-file", "abi", "empty", "ambiguous", "elided"])
def test_each_rejection_reason_is_in_the_next_prompt_for_that_parent(rig, answer, said):
    r = rig([{"response": answer}, {"response": PATCH}])
    assert r.propose(PARENT) is None
    assert r.propose(PARENT) is not None
    first, second = r.prompts()
    assert "## Your previous answer was not used" not in first
    assert "## Your previous answer was not used" in second
    for s in said:
        assert s in second, s
    assert "attempt 1 (m): rejected before compiling" in second
    assert r.hashes()[0] != r.hashes()[1]


def test_a_rejected_whole_file_answer_is_followed_by_a_different_prompt(rig):
    r = rig([{"response": BIG_REWRITE}, {"response": BIG_REWRITE}, {"response": PATCH}])
    assert r.propose(PARENT) is None and r.propose(PARENT) is None
    prop = r.propose(PARENT)
    assert prop is not None and "s(i) + 0.0f" in prop.source
    assert len(set(r.hashes())) == 3
    assert "attempt 2 (m): rejected before compiling: whole-file rewrite" in r.prompts()[2]


def test_a_small_whole_file_answer_is_accepted_as_its_diff(rig):
    r = rig([{"response": "```cuda\n" + GOOD.replace("d(i) = s(i);", "d(i) = s(i) * 1.0f;") + "```\n"}])
    prop = r.propose(PARENT)
    assert prop is not None and "s(i) * 1.0f" in prop.source
    assert r.attempts[0].form == "whole_file" and "1 changed line" in r.attempts[0].notes[0]


def test_harmless_marker_variants_over_the_wire_make_the_child(rig):
    """ORIGINAL/UPDATED markers, a file name after SEARCH, fences inside a block: applied."""
    search, replace = "  if (i < n) d(i) = s(i);\n", "  if (i < n) d(i) = s(i) + 0.0f;\n"
    for answer in (f"<<<<<<< ORIGINAL\n{search}=======\n{replace}>>>>>>> UPDATED\n",
                   f"<<<<<<< SEARCH kernel.cu\n{search}=======\n{replace}>>>>>>> REPLACE\n",
                   f"<<<<<<< SEARCH\n```cuda\n{search}```\n=======\n```cuda\n{replace}```\n>>>>>>> REPLACE\n"):
        r = rig([{"response": answer}])
        prop = r.propose(PARENT)
        assert prop is not None and "s(i) + 0.0f" in prop.source, (answer, r.attempts[-1].problems)
        assert r.attempts[-1].notes, "what was tolerated is noted"


def test_a_duplicate_is_said_plainly_with_the_earlier_outcome(rig):
    r = rig([{"response": PATCH, "repeat": True}])
    first = r.propose(PARENT)
    cid = candidate_id(first.source, canonical_params(first.params), TASK)
    r.mut.observe(cid, 1.25)
    assert r.propose(PARENT, seen=frozenset({cid})) is None
    assert r.propose(PARENT, seen=frozenset({cid}), i=1) is None
    p = r.prompts()[2]
    assert f"produced kernel {cid[:12]}, which this run already tried; its outcome: child {cid[:12]} is correct: " \
           "1.250x" in p
    assert f"attempt 1 (m): child {cid[:12]} is correct: 1.250x" in p


def test_never_the_same_prompt_twice_in_a_row_even_when_the_endpoint_fails(rig):
    r = rig([{"status": 503, "repeat": True}])
    for i in range(4):
        assert r.propose(PARENT, i=i) is None
    h = r.hashes()
    assert len(h) == 4 and all(a != b for a, b in zip(h, h[1:]))
    assert "attempt 1 (m): the endpoint failed, no answer" in r.prompts()[1]


def test_identical_rendering_gets_a_repeat_line(rig):
    r = rig([{"response": PATCH, "repeat": True}])
    for i in range(2):
        msgs = r.mut.render("optimize", PARENT, MutationContext(TASK, 0, 1), r.mut.models[0], chain="x").messages
        out = r.mut._not_twice("x", msgs, r.mut.models[0], i + 1)
    assert "The previous prompt was the same as this one" in out[-1]["content"]


# ---- the repair loop, mutator side --------------------------------------------------------------


def _broken(src: str, parent_id: str, stage="compile", status=Status.COMPILE_ERROR) -> Member:
    return Member(candidate=Candidate.create(TASK, src, {}, parents=(parent_id,), operator="llm:m", generation=2),
                  fitness=None, status=status)


FIX_BLOK = render_blocks([Block("  int64_t i = int64_t(blockIdx.x) * BLOK + threadIdx.x;\n",
                                "  int64_t i = int64_t(blockIdx.x) * BLOCK + threadIdx.x;\n")])


def test_a_failed_child_is_offered_repaired_and_linked_to_the_broken_one(rig):
    broken = _broken(BAD, PARENT.id)
    r = rig([{"response": FIX_BLOK}], failures={broken.id: ("compile", "compile_error", ERR)})
    req = r.mut.offer_repair(broken)
    assert req is not None and (req.round, req.root_id, req.anchor_id, req.stage) == (1, broken.id, PARENT.id,
                                                                                       "compile")
    assert r.mut.offer_repair(broken) is None, "queued once"
    assert r.mut.pending_repairs(TASK) == 1
    got = r.mut.next_repair(TASK)
    assert got == req and r.mut.next_repair(TASK) is None
    prop = r.mut.repair(got, MutationContext(TASK, 0, 3), random.Random(0))
    assert prop is not None and prop.parents == (broken.id,) and "* BLOCK +" in prop.source
    assert "repair round 1" in prop.notes
    p = r.prompts()[0]
    assert p.startswith("[kind:repair]") and 'identifier "BLOK" is undefined' in p
    assert ">>   16 |   int64_t i = int64_t(blockIdx.x) * BLOK + threadIdx.x;" in p


def test_rounds_per_failure_and_a_worse_repair_is_not_the_next_base(rig):
    root = _broken(BAD, PARENT.id, stage="correctness", status=Status.INCORRECT)
    wrong_patch = render_blocks([Block("  if (i < n) d(i) = s(i);\n", "  if (i < n) d(i) = s(i) +;\n")])
    r = rig([{"response": wrong_patch}, {"response": FIX_BLOK}, {"response": FIX_BLOK}], repair_rounds=2,
            failures={root.id: ("correctness", "incorrect", "shape N=1000: max abs error 3.1 at [999]")})
    req1 = r.mut.offer_repair(root)
    p1 = r.mut.repair(r.mut.next_repair(), MutationContext(TASK, 0, 3), random.Random(0))
    child1 = Member(candidate=Candidate.create(TASK, p1.source, p1.params, parents=(root.id,), operator="llm:m"),
                    fitness=None, status=Status.COMPILE_ERROR)
    r.failures[child1.id] = ("compile", "compile_error", "candidate.cu(17): error: expected an expression")
    r.mut.observe(child1.id, None)
    req2 = r.mut.offer_repair(child1)
    assert req2.round == 2 and req2.root_id == root.id
    assert req2.broken.id == root.id, "the compile-broken attempt is worse than a wrong result: repair the root again"
    assert r.mut.repair(r.mut.next_repair(), MutationContext(TASK, 0, 3), random.Random(1)) is not None
    p = r.prompts()[1]
    assert f"attempt 1 (m): child {child1.id[:12]} fails compile (compile_error): candidate.cu(17): error: expected " \
           "an expression -- worse than the kernel being repaired (which fails only at correctness)" in p
    # round 3 > repair_rounds = 2: declined
    child2 = Member(candidate=Candidate.create(TASK, GOOD, {}, parents=(root.id,), operator="llm:m"), fitness=None,
                    status=Status.INCORRECT)
    r.failures[child2.id] = ("correctness", "incorrect", "still wrong")
    r.mut.repairs.link(child2.id, req2)
    assert r.mut.offer_repair(child2) is None
    assert req1.round == 1


def test_per_lineage_cap_and_unrepairable_stages(rig):
    r = rig([], repair_per_lineage=2)
    kids = [_broken(BAD.replace("BLOK", f"BLOK{i}"), PARENT.id) for i in range(3)]
    for k in kids:
        r.failures[k.id] = ("compile", "compile_error", ERR)
    assert [r.mut.offer_repair(k) is not None for k in kids] == [True, True, False]
    timing = _broken(BAD.replace("BLOK", "BLOKT"), "other-parent", status=Status.INVALID)
    r.failures[timing.id] = ("timing", "invalid", "beats the speed of light")
    assert r.mut.offer_repair(timing) is None
    assert r.mut.offer_repair(PARENT) is None, "a correct member is not repaired"


def test_concurrent_proposals_share_one_mutator_safely():
    """8 proposals from 8 threads, client concurrency 4, each call 0.5 s: two waves, ~1 s."""
    import threading
    import time

    parents = [Member(candidate=Candidate.create(TASK, GOOD.replace("tiny_copy_kernel", f"k{i}"), {}, operator="seed"),
                      fitness=1.0) for i in range(8)]
    srv = FakeLLMServer(Cassette([{"response": PATCH, "delay_s": 0.5, "repeat": True}])).start()
    try:
        spec = ModelSpec("m", srv.base_url, "m", key_env="EVO_TEST_NO_KEY")
        recs = []
        mut = LLMMutator(LLMClient(timeout_s=5, max_attempts=1, concurrency=4), [spec],
                         SimpleContextProvider({TASK: INFO}), attempt_sink=recs.append)
        out, errors = [None] * 8, []

        def go(i):
            try:
                out[i] = mut.propose([parents[i]], MutationContext(TASK, i % 2, 1), random.Random(i))
            except Exception as e:  # noqa: BLE001 - the test reports any
                errors.append(e)

        threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
        t = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        elapsed = time.monotonic() - t
    finally:
        srv.stop()
    assert not errors and all(p is not None for p in out)
    assert 0.9 <= elapsed < 5.0, elapsed   # at once: one after another would take 8 s
    assert sorted(r.attempt_key for r in recs) == sorted(f"optimize:{p.id}:1" for p in parents)
    assert mut.attempts == 8 and mut.bandit.stats()["m"]["pulls"] == 8
