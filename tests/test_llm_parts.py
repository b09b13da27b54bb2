"""The LLM mutator's parts on their own: the settings record it is built from, the attempt
memory, the model chooser's reward ledger and the prompt builder (the whole mutator is tested
through them in tests/test_llm_mutator.py and the other tests/test_llm_*.py)."""

from __future__ import annotations

import random

import pytest

from mutators.base import MutationContext
from mutators.llm.attempts import AttemptMemory, AttemptNote
from mutators.llm.bandit import ModelChooser
from mutators.llm.client.calls import LLMCall
from mutators.llm.client.health import NoModelLeft
from mutators.llm.client.model_spec import ModelSpec
from mutators.llm.mutator import LLMMutator, LLMMutatorSettings
from mutators.llm.prompt.builder import PromptBuilder
from mutators.llm.replay.cassette import ReplayClient
from tests.test_llm_mutator import FIXED, GOOD, INFO, TASK
from mutators.llm.prompt.context import SimpleContextProvider

SPEC = ModelSpec("m", "http://127.0.0.1:9/v1", "fake-coder", key_env="EVO_TEST_NO_KEY", context_tokens=40_000,
                 max_output_tokens=8000)


def test_the_mutator_is_built_from_one_settings_record():
    s = LLMMutatorSettings(repair_rounds=2, repair_per_lineage=5, history_per_parent=3, n_inspirations=0,
                           concurrency=3, max_failed_attempts=7)
    assert LLMMutatorSettings.from_dict(s.to_dict()) == s
    mut = LLMMutator(ReplayClient([]), [SPEC], SimpleContextProvider({TASK: INFO}), s)
    assert mut.settings is s and (mut.repairs.rounds, mut.repairs.per_lineage) == (2, 5)
    assert mut.memory.per_parent == 3 and mut.prompts.n_inspirations == 0
    assert mut.concurrency == 3 and mut.max_failed_attempts == 7
    over = LLMMutator(ReplayClient([]), [SPEC], SimpleContextProvider({TASK: INFO}), s, repair_rounds=4)
    assert over.settings == LLMMutatorSettings(**{**s.to_dict(), "repair_rounds": 4})


@pytest.mark.parametrize("bad, text", [
    ({"n_inspirations": 4}, "n_inspirations=4: must be within [0, 3]"),
    ({"concurrency": 0}, "concurrency=0: must be >= 1"),
    ({"history_parents": 0}, "history_parents=0: must be >= 1"),
    ({"repair_rounds": -1}, "repair_rounds=-1: must be >= 0"),
    ({"whole_file_fraction": 1.5}, "whole_file_fraction=1.5: must be within [0, 1]"),
])
def test_settings_errors_name_the_field_the_value_and_what_is_allowed(bad, text):
    with pytest.raises(ValueError) as e:
        LLMMutatorSettings(**bad)
    assert str(e.value) == text


def test_an_unknown_setting_names_the_known_ones():
    with pytest.raises(TypeError, match="unknown LLM mutator setting.*'temperature'.*known: max_response_kb"):
        LLMMutator(ReplayClient([]), [SPEC], SimpleContextProvider({TASK: INFO}), temperature=0.2)


def test_attempt_memory_numbers_notes_and_forgets_by_chain():
    mem = AttemptMemory(parents=2, per_parent=2)
    assert [mem.number("a"), mem.number("a"), mem.number("b")] == [1, 2, 1]
    for n in (3, 1, 2):  # noted out of order (calls finish in any order): kept in attempt order
        mem.note("a", AttemptNote(n, "m", "optimize", "rejected", f"t{n}", feedback=f"fix {n}"))
    assert [x.n for x in mem.notes("a")] == [2, 3] and mem.feedback("a") == "fix 3"
    mem.note("b", AttemptNote(1, "m", "optimize", "child", "", "c1"))
    assert mem.feedback("b") is None
    mem.note("c", AttemptNote(1, "m", "optimize", "child", "", "c2"))  # a third chain: "a" is forgotten
    assert mem.notes("a") == () and mem.number("a") == 1
    msgs = [{"role": "user", "content": "same"}]
    assert mem.not_twice("b", msgs, SPEC, 2) == msgs
    again = mem.not_twice("b", msgs, SPEC, 3)
    assert "The previous prompt was the same" in again[-1]["content"] and msgs[-1]["content"] == "same"
    mem.record_result("c1", 1.25)
    assert mem.result("c1") == (True, 1.25) and mem.result("zz") == (False, None)


def test_chooser_pays_each_child_what_it_gained_over_its_baseline():
    a, b = SPEC, ModelSpec("n", SPEC.base_url, "other", key_env="EVO_TEST_NO_KEY")
    ch = ModelChooser([a, b])
    ch.expect("c1", a, baseline=1.0, cost=0.01)
    ch.expect("c2", b, baseline=1.0, cost=0.01)
    ch.observe("c1", 1.5)
    ch.observe("c2", None)  # incorrect: earns 0
    ch.observe("c1", 9.0)  # paid once
    stats = ch.bandit.stats()
    assert stats["m"]["gain"] == pytest.approx(0.5) and stats["n"]["gain"] == 0 and stats["n"]["finished"] == 1
    ch.called(b, LLMCall("n", "h", (), "", error="HTTP 401 [fatal:auth] (not retried): bad key"))
    assert all(ch.choose(random.Random(i)).name == "m" for i in range(5))
    ch.called(a, LLMCall("m", "h", (), "", error="HTTP 401 [fatal:auth] (not retried): bad key"))
    with pytest.raises(NoModelLeft):
        ch.choose(random.Random(0))


def test_prompt_builder_sizes_to_what_the_endpoint_said():
    other = GOOD.replace("tiny_copy_kernel", "other_kernel")
    provider = SimpleContextProvider({TASK: INFO}, histories={FIXED.id: [(1, None), (2, 1.5)]},
                                     inspirations={(TASK, 0): [(other, 2.25), (other.replace("other", "third"), 2.0)]})
    builder = PromptBuilder(provider, AttemptMemory())
    ctx = MutationContext(TASK, 0, 3, frozenset())
    full = builder.render("optimize", FIXED, ctx, SPEC, chain=FIXED.id)
    assert full.fits and full.budget == 32_000 and not full.omitted
    window = full.tokens + full.tokens // 2  # its budget (half of it) is under what the full prompt needs
    builder.learn_window(SPEC, window)
    assert builder.window(SPEC) == window and builder.prompt_budget(SPEC) == window - window // 2
    small = builder.render("optimize", FIXED, ctx, SPEC, chain=FIXED.id)
    assert small.fits and small.omitted and small.tokens <= small.budget < full.tokens
    msgs = list(full.messages)
    chars = sum(len(m["content"]) for m in msgs)
    builder.calibrate(SPEC, msgs, LLMCall("m", "h", tuple(msgs), "ok", tokens_in=chars // 4 + 16))
    assert builder.calibrated("m") and 3.7 < builder.chars_per_token("m") < 3.9
