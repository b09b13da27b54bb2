"""evo.engine.pacing: slow tasks' proposals run ahead so that the tasks finish together."""

from __future__ import annotations

import heapq

from evo.engine.pacing import Pacing, island_order, leads

ISLANDS = [(0, "gemm"), (1, "gemm"), (2, "relu"), (3, "relu"), (4, "gelu"), (5, "gelu")]


def test_leads_follow_latency_and_are_capped():
    got = leads({"gemm": 31.0, "relu": 11.0, "gelu": 11.0}, throughput=0.6, n_tasks=3, cap=10.0)
    assert got == {"gemm": (31.0 - 11.0) * 0.6 / 3, "relu": 0.0, "gelu": 0.0}
    assert leads({"gemm": 300.0, "relu": 1.0}, throughput=1.0, n_tasks=2, cap=3.5)["gemm"] == 3.5


def test_no_lead_without_two_measured_tasks_or_a_throughput():
    assert leads({"gemm": 31.0}, throughput=1.0, n_tasks=3, cap=9) == {}
    assert leads({"gemm": 31.0, "relu": 11.0}, throughput=0.0, n_tasks=2, cap=9) == {}


def test_without_lead_the_order_is_the_round_robin():
    order = island_order(ISLANDS, proposed={"gemm": 9}, island_proposed={}, lead={}, remaining=40, start=4)
    assert order == [4, 5, 0, 1, 2, 3]
    assert island_order(ISLANDS, proposed={}, island_proposed={}, lead={"relu": 0.0}, remaining=9, start=1) == \
        [1, 2, 3, 4, 5, 0]


def test_the_slow_task_goes_first_while_within_its_lead():
    counts = {"gemm": 6, "relu": 4, "gelu": 4}
    order = island_order(ISLANDS, proposed=counts, island_proposed={0: 3, 1: 3, 2: 2, 3: 2, 4: 2, 5: 2},
                         lead={"gemm": 3.0}, remaining=30, start=2)
    assert order[0] in (0, 1)         # 6 - 3 = 3 < 4: gemm is owed a proposal
    order = island_order(ISLANDS, proposed={"gemm": 8, "relu": 4, "gelu": 4}, island_proposed={0: 4, 1: 4},
                         lead={"gemm": 3.0}, remaining=30, start=0)
    assert order[0] not in (0, 1)     # 8 - 3 = 5 > 4: beyond its lead it waits


def test_a_task_with_its_share_of_the_budget_waits_for_the_others():
    counts = {"gemm": 6, "relu": 4, "gelu": 4}
    order = island_order(ISLANDS, proposed=counts, island_proposed={}, lead={"gemm": 3.0}, remaining=7, start=0)
    assert order[0] in (0, 1)         # (14 + 7) / 3 = 7 each: gemm's 7th is within its share
    order = island_order(ISLANDS, proposed=counts, island_proposed={}, lead={"gemm": 3.0}, remaining=6, start=0)
    assert order[0] not in (0, 1)     # 20 / 3 = 6.67: gemm has its share, the others catch up


def test_within_a_task_the_less_used_island_goes_first():
    order = island_order(ISLANDS, proposed={"gemm": 0, "relu": 5, "gelu": 5}, island_proposed={0: 3, 1: 2},
                         lead={"relu": 0.5}, remaining=30, start=0)
    assert order[:2] == [1, 0]


def _simulate(pacing: Pacing, compile_s: dict[str, float], gpu_s: dict[str, float], *, budget: int,
              slots: int) -> tuple[float, dict[str, int]]:
    """A run in event time, shaped like the demo: ``slots`` candidates in flight, compiles in
    parallel, one GPU judging in arrival order; a verdict frees a slot, which proposes the next
    child. Returns the last verdict's time and the proposals by task."""
    islands = [(i, t) for i, t in enumerate(t for t in compile_s for _ in range(2))]
    events: list[tuple[float, str, str]] = []
    now = gpu_free = 0.0
    proposed = rr = inflight = 0
    counts = dict.fromkeys(compile_s, 0)

    def fill() -> None:
        nonlocal proposed, rr, inflight
        while inflight < slots and proposed < budget:
            idx = pacing.order(islands, throughput=0.75, inflight=slots, remaining=budget - proposed,
                               start=rr % len(islands))[0]
            rr, task = rr + 1, dict(islands)[idx]
            pacing.proposed(task, idx)
            counts[task], proposed, inflight = counts[task] + 1, proposed + 1, inflight + 1
            heapq.heappush(events, (now + compile_s[task], "compiled", task))

    fill()
    last = 0.0
    while events:
        now, kind, task = heapq.heappop(events)
        if kind == "compiled":
            pacing.compiled(task, compile_s[task])
            gpu_free = max(now, gpu_free) + gpu_s[task]
            heapq.heappush(events, (gpu_free, "judged", task))
        else:
            pacing.judged(task, gpu_s[task])
            inflight, last = inflight - 1, now
            fill()
    return last, counts


def test_paced_run_ends_sooner_with_the_same_counts():
    compile_s = {"gemm": 30.0, "relu": 10.0, "gelu": 10.0, "softmax": 11.0}
    gpu_s = {"gemm": 0.3, "relu": 1.4, "gelu": 1.3, "softmax": 1.6}
    paced_end, paced = _simulate(Pacing(), compile_s, gpu_s, budget=48, slots=14)
    turn_end, turns = _simulate(Pacing(enabled=False), compile_s, gpu_s, budget=48, slots=14)
    assert turns == paced == {"gemm": 12, "relu": 12, "gelu": 12, "softmax": 12}
    assert paced_end < turn_end - 4.0, (paced_end, turn_end)   # 71.2 s against 77.5 s
