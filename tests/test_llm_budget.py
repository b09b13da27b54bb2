"""The budget reserves the worst case of requests in flight; cached input is priced at its own
price; a 429 backs off (Retry-After, retry-after-ms, capped) and never stops a model."""

from __future__ import annotations

import random
import threading
import time

import pytest

from mutators.llm.client.budget import Budget, BudgetExhausted
from mutators.llm.client.calls import LLMCall
from mutators.llm.client.chat import LLMClient, estimate_prompt_tokens_safe
from mutators.llm.client.health import ModelHealth
from mutators.llm.client.http_errors import retry_after_seconds
from mutators.llm.client.model_spec import ModelSpec
from mutators.llm.replay.cassette import Cassette
from mutators.llm.replay.fake_server import FakeLLMServer

MSGS = [{"role": "user", "content": "write the kernel " * 50}]


def _spec(srv: FakeLLMServer, **kw) -> ModelSpec:
    base = dict(name="m", base_url=srv.base_url, model="gpt-4.1", key_env="EVO_TEST_UNSET_KEY",
                price_in_per_mtok=2.0, price_out_per_mtok=8.0, max_output_tokens=1000)
    base.update(kw)
    return ModelSpec(**base)


def _wait_for(pred, what: str) -> None:
    """Poll a state another thread reaches (not a timing assumption: it only bounds a hang)."""
    deadline = time.monotonic() + 10
    while not pred():
        assert time.monotonic() < deadline, f"never reached: {what}"
        time.sleep(0.002)


def test_reserve_waits_for_reservations_in_flight_and_refuses_when_spending_would_pass():
    b = Budget(1.0)
    first = b.reserve(0.6)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(b.reserve(0.6)))
    t.start()
    _wait_for(lambda: b.waiting == 1, "the second reservation waits for the first")
    assert got == [] and b.reserved == 0.6
    b.settle(first, 0.1)  # the first request cost less than its worst case: room for the second
    t.join(5)
    assert got == [0.6] and b.reserved == 0.6 and b.spent == pytest.approx(0.1)
    b.settle(0.6, 0.5)
    with pytest.raises(BudgetExhausted, match="nearly spent.*may cost up to"):
        b.reserve(0.6)  # 0.6 spent + 0.6 worst case > 1.0
    assert b.reserved == 0 and b.waiting == 0


def test_concurrent_calls_never_spend_past_the_budget():
    # every answer costs exactly its worst case: the prompt counted high plus max_output_tokens
    with FakeLLMServer(Cassette([{"response": "ok", "tokens_in": estimate_prompt_tokens_safe(MSGS),
                                  "tokens_out": 1000, "delay_s": 0.05, "repeat": True}])) as srv:
        spec = _spec(srv)
        worst = LLMClient.worst_cost(MSGS, spec)
        budget = Budget(2.5 * worst)
        client = LLMClient(budget=budget, concurrency=4, rng=random.Random(0))
        outcomes: list[str] = []

        def one() -> None:
            try:
                outcomes.append("ok" if client.complete(MSGS, model=spec).ok else "failed")
            except BudgetExhausted:
                outcomes.append("refused")

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        sent = len(srv.requests)
    assert sorted(outcomes) == ["ok", "ok", "refused", "refused"] and sent == 2
    assert budget.spent == pytest.approx(2 * worst) and budget.spent <= budget.max_usd and budget.reserved == 0


@pytest.mark.parametrize("cached_price, expect", [(0.5, (1000 * 2.0 + 3000 * 0.5 + 100 * 8.0) / 1e6),
                                                  (None, (4000 * 2.0 + 100 * 8.0) / 1e6)])
def test_cached_prompt_tokens_are_priced_at_the_cached_price(cached_price, expect):
    with FakeLLMServer(Cassette([{"response": "ok", "tokens_in": 4000, "tokens_out": 100,
                                  "cached_tokens": 3000}])) as srv:
        call = LLMClient(rng=random.Random(0)).complete(MSGS, model=_spec(srv, price_cached_input_per_mtok=cached_price))
    assert call.ok and call.cached_tokens == 3000 and call.cost == pytest.approx(expect)


# ---- 429 ---------------------------------------------------------------------------------------


def test_429_waits_are_retry_after_capped_else_exponential_capped():
    waits: list[float] = []
    cas = Cassette([{"status": 429, "retry_after": 500}] + [{"status": 429}] * 4 + [{"response": "ok"}])
    with FakeLLMServer(cas, dialect="openai") as srv:
        client = LLMClient(max_attempts=6, backoff_base_s=1.0, backoff_max_s=4.0, jitter=0.5, retry_after_max_s=60,
                           sleep=waits.append, rng=random.Random(0))
        call = client.complete(MSGS, model=_spec(srv))
    assert call.ok and call.attempts == 6
    assert waits[0] == 60  # the server's Retry-After, capped
    for k, w in enumerate(waits[1:], start=2):  # backoff_base_s * 2**(k-1), capped, times jitter in [1, 1.5)
        base = min(4.0, 2.0 ** (k - 1))
        assert base <= w < 1.5 * base, (k, waits)
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5  # OpenAI's precise header
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2026 07:28:00 GMT"}) is None


def _rate_limited() -> LLMCall:
    with FakeLLMServer(Cassette([{"status": 429, "repeat": True}]), dialect="openai") as srv:
        call = LLMClient(max_attempts=2, sleep=lambda s: None, rng=random.Random(0)).complete(MSGS, model=_spec(srv))
    assert call.rate_limited and call.fatal is None
    return call


def test_a_persistent_429_never_stops_a_model():
    models = [ModelSpec(name=n, base_url="http://127.0.0.1:1/v1", model="x") for n in ("busy", "other")]
    health = ModelHealth(models, failures=1, trips=1, cooldown_s=5)
    call = _rate_limited()
    for _ in range(20):
        health.chose("other")
        if "busy" in health.usable():
            assert health.record("busy", call) is None
    assert health.stopped() == {} and health.usable() in (["other"], ["busy", "other"])
    assert {s.name: s.status for s in health.states()}["busy"] in ("open", "half_open")
    failed = LLMCall("busy", "h", (), "", error="HTTP 500: oops (gave up after 4 attempts)")
    health.force_half_open()
    assert health.record("busy", failed) is not None  # any other failure still stops it at the last trip
