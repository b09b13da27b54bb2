"""The LLM mutator: prompts a model for a child kernel and turns its answer into a Proposal.

:class:`LLMMutator` implements :class:`mutators.base.Mutator`. Per call to ``propose``:

1. prompt kind: ``genesis`` when ``parents`` is empty (write a kernel from the task's
   reference), ``repair`` when the primary parent is incorrect (``Member.fitness is None``),
   else ``optimize``;
2. the :class:`ModelBandit` picks a model (UCB1 on fitness improvement per dollar, with a
   prior from the configured weights);
3. the prompt is rendered from ``mutators/prompts/<kind>.md`` with what the injected
   :class:`PromptContextProvider` knows (reference, ABI, shapes, failure text, lineage
   fitness, inspirations from other islands, profile numbers when the caller allows them);
4. the client sends it (retries, budget; every call goes to the client's CallSink);
5. the answer is parsed: a whole ```` ```cuda ```` file for genesis, SEARCH/REPLACE blocks
   for repair and optimize (a whole-file answer is rejected there), applied tolerantly and
   validated (no-op, ABI, include, markers, duplicates).

Any failure of steps 4-5 (an errored call, prose, broken or unmatched blocks, an empty or
oversized answer, a child that breaks the ABI) returns ``None`` and is reported as an
:class:`AttemptRecord` to the ``attempt_sink`` and kept in :attr:`LLMMutator.last_failure`;
unmatched SEARCH blocks are remembered per parent (bounded) and shown in the next prompt for
that parent. ``propose`` raises only :class:`mutators.base.MutatorStopped` (the budget is
spent: :class:`mutators.client.BudgetExhausted`; every model is stopped:
:class:`mutators.health.NoModelLeft`; the engine stops proposing and ends the run with its
one-line message), :class:`mutators.cassette.ReplayMiss` (a replay diverged) and
configuration errors.

Model health (:mod:`mutators.health`): a call that fails in a way no retry can heal (401,
403, unknown model, a rejected parameter, a prompt over the context window, no quota) stops
that model for the run, with one log line and an ``on_model_stop`` report; repeated
transient failures open the model's circuit breaker. The bandit only chooses among the
models still usable.

The engine reports each evaluated LLM child back through :meth:`LLMMutator.observe` so the
bandit learns which model pays off; the chosen model is in ``Proposal.operator``
(``llm:<name>``).
"""

from __future__ import annotations

import logging
import math
import random
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from evo.records import Member, candidate_id, canonical_params
from evo.tunables import TunableError, parse_tunables, resolve_params
from mutators.base import MutationContext, Proposal
from mutators.client import ChatClient, LLMCall, LLMConfigError, ModelSpec
from mutators.health import ModelHealth, NoModelLeft, StopSink
from mutators.patch import (
    UnmatchedBlock,
    strip_reasoning,
    apply_blocks,
    extract_whole_file,
    parse_blocks,
    validate_child,
)
from mutators.templates import render_prompt

__all__ = [
    "TaskInfo",
    "PromptContextProvider",
    "SimpleContextProvider",
    "AttemptRecord",
    "AttemptSink",
    "ModelBandit",
    "LLMMutator",
    "failing_lines",
    "trim_error",
]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------
# What the prompts need to know
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskInfo:
    """Task facts rendered into prompts, already as text.

    ``sol_text`` describes the speed-of-light bound (e.g. "benchmark shape: 0.21 ms at peak
    DRAM bandwidth; memory-bound"); "" when unknown.
    """

    reference_src: str
    abi_text: str
    shapes_text: str
    dtype: str
    tolerance_text: str
    sol_text: str = ""


class PromptContextProvider(Protocol):
    """Read-only access to what a prompt may show (the engine implements it over the store).

    - ``task_info(task)``: the task's reference, ABI text, shapes, dtype, tolerance, SOL.
    - ``history(candidate_id)``: ``[(generation, fitness)]`` along the lineage, oldest first
      (incorrect ancestors may carry ``None``).
    - ``inspirations(task, island, n)``: up to ``n`` ``(source, fitness)`` of good members of
      *other* islands.
    - ``profile(candidate_id)``: profile metrics, or ``None`` while the caller's rule
      (lineage depth >= ``profile.feedback_after``) does not allow them yet; the optimize
      prompt shows a profile section only when this is not ``None``.
    - ``failure(candidate_id)``: ``(stage, status, error_text)`` of the failed stage, or None.
    """

    def task_info(self, task: str) -> TaskInfo: ...

    def history(self, candidate_id: str) -> list[tuple[int, float | None]]: ...

    def inspirations(self, task: str, island: int, n: int) -> list[tuple[str, float]]: ...

    def profile(self, candidate_id: str) -> dict[str, Any] | None: ...

    def failure(self, candidate_id: str) -> tuple[str, str, str] | None: ...


class SimpleContextProvider:
    """An in-memory :class:`PromptContextProvider` over plain dicts (tests, demos, replays)."""

    def __init__(
        self,
        tasks: dict[str, TaskInfo],
        *,
        histories: dict[str, list[tuple[int, float | None]]] | None = None,
        inspirations: dict[tuple[str, int], list[tuple[str, float]]] | None = None,
        profiles: dict[str, dict[str, Any]] | None = None,
        failures: dict[str, tuple[str, str, str]] | None = None,
    ) -> None:
        self.tasks = tasks
        self.histories = histories or {}
        self.inspiration_map = inspirations or {}
        self.profiles = profiles or {}
        self.failures = failures or {}

    def task_info(self, task: str) -> TaskInfo:
        if task not in self.tasks:
            raise KeyError(f"no TaskInfo for task {task!r}; known: {', '.join(sorted(self.tasks)) or 'none'}")
        return self.tasks[task]

    def history(self, candidate_id: str) -> list[tuple[int, float | None]]:
        return list(self.histories.get(candidate_id, []))

    def inspirations(self, task: str, island: int, n: int) -> list[tuple[str, float]]:
        return list(self.inspiration_map.get((task, island), []))[:n]

    def profile(self, candidate_id: str) -> dict[str, Any] | None:
        return self.profiles.get(candidate_id)

    def failure(self, candidate_id: str) -> tuple[str, str, str] | None:
        return self.failures.get(candidate_id)


# --------------------------------------------------------------------------------------
# Attempts
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttemptRecord:
    """One ``propose`` that reached the model, successful (``ok``) or not.

    ``problems`` says why the answer was rejected; ``unmatched`` holds the SEARCH blocks that
    matched nowhere; ``candidate_id`` is the child's id when a proposal was made;
    ``prompt_hash`` links to the ``llm_calls`` row the client's sink stored.
    """

    kind: str
    parent_id: str | None
    model: str
    ok: bool
    problems: tuple[str, ...] = ()
    unmatched: tuple[UnmatchedBlock, ...] = ()
    prompt_hash: str = ""
    candidate_id: str | None = None
    cost: float = 0.0
    call_error: str | None = None


AttemptSink = Callable[[AttemptRecord], None]


# --------------------------------------------------------------------------------------
# Bandit
# --------------------------------------------------------------------------------------


class ModelBandit:
    """UCB1 over models; value = fitness gained per dollar, with a floor on the dollars.

    A pull is counted when :meth:`choose` picks the arm (so results still in flight spread
    proposals instead of piling onto one arm); :meth:`update` adds a finished pull's gain
    (``max(0, reward)``) and cost. An arm's rate is ``sum(gain) / sum(max(cost, floor))``
    with ``floor = max(cost_floor_usd, floor_fraction * mean cost of the priced pulls so
    far)``: a free (or nearly free) model is charged as if each call cost a fraction of a
    typical paid call, so it wins only when it gains at least that fraction as much per
    call. (A fixed $0.0001 floor let a free model take 213 of 300 pulls for 0.32 total
    gain against 7.4 for the paid one.) Rates are normalised by the best arm's rate, so
    values stay in [0, 1] whatever the currency.

    Each arm starts with ``prior_n`` pseudo-pulls of value ``0.5 * weight / max(weight)``.
    Score = mean + ``c * sqrt(2 ln(N + 1) * w / n)`` with ``w = weight / max(weight)``: the
    weights also scale exploration, so while no reward has come back proposals are spread
    in proportion to the weights. Ties are broken by ``rng``. Models of weight 0 are never
    chosen.
    """

    def __init__(
        self, models: Sequence[ModelSpec], *, c: float = 1.0, prior_n: float = 1.0, cost_floor_usd: float = 1e-4,
        floor_fraction: float = 0.25,
    ) -> None:
        active = [m for m in models if m.weight > 0]
        if not active:
            raise LLMConfigError(
                "no model with weight > 0; give at least one [[llm.models]] entry a positive weight"
            )
        names = [m.name for m in active]
        if len(set(names)) != len(names):
            raise LLMConfigError(f"model names must be unique, got {names}")
        if not 0 <= floor_fraction <= 1:
            raise ValueError(f"floor_fraction={floor_fraction}: must be within [0, 1]")
        self.models = tuple(active)
        self.c = c
        self.prior_n = prior_n
        self.cost_floor_usd = cost_floor_usd
        self.floor_fraction = floor_fraction
        wmax = max(m.weight for m in active)
        self._prior = {m.name: 0.5 * m.weight / wmax for m in active}
        self._share = {m.name: m.weight / wmax for m in active}
        self._pulls = {m.name: 0 for m in active}
        self._gain = {m.name: 0.0 for m in active}
        self._costs: dict[str, list[float]] = {m.name: [] for m in active}
        self._lock = threading.Lock()

    def _arm(self, model: ModelSpec | str) -> str:
        name = model if isinstance(model, str) else model.name
        if name not in self._pulls:
            raise KeyError(f"unknown model {name!r}; bandit arms: {', '.join(self._pulls)}")
        return name

    def floor(self) -> float:
        """The per-pull cost floor now (see class docstring)."""
        priced = [c for cs in self._costs.values() for c in cs if c > 0]
        typical = sum(priced) / len(priced) if priced else 0.0
        return max(self.cost_floor_usd, self.floor_fraction * typical)

    def rates(self) -> dict[str, float]:
        """Gain per (floored) dollar of each arm's finished pulls (0 before any)."""
        fl = self.floor()
        return {n: (self._gain[n] / sum(max(c, fl) for c in cs)) if cs and fl > 0 else 0.0
                for n, cs in self._costs.items()}

    def scores(self) -> dict[str, float]:
        rates = self.rates()
        best = max(rates.values(), default=0.0)
        total = sum(self._pulls.values())
        out = {}
        for m in self.models:
            n = self.prior_n + self._pulls[m.name]
            norm = rates[m.name] / best if best > 0 else 0.0
            done = len(self._costs[m.name])
            # pulls still in flight count as 0 until they report (as the prior pseudo-pulls do)
            mean = (self.prior_n * self._prior[m.name] + done * norm) / n
            share = self._share[m.name]
            out[m.name] = mean + self.c * math.sqrt(2.0 * math.log(total + 1.0) * share / n)
        return out

    def choose(self, rng: random.Random, among: Sequence[str] | None = None) -> ModelSpec:
        """Pick an arm (of ``among``, default all) and count the pull."""
        with self._lock:
            s = self.scores()
            arms = [m for m in self.models if among is None or m.name in among]
            if not arms:
                raise LLMConfigError(f"no bandit arm among {list(among or [])}; arms: {', '.join(self._pulls)}")
            best = max(s[m.name] for m in arms)
            ties = [m for m in arms if s[m.name] >= best - 1e-12]
            pick = ties[0] if len(ties) == 1 else rng.choice(ties)
            self._pulls[pick.name] += 1
            return pick

    def update(self, model: ModelSpec | str, reward: float, cost: float) -> None:
        name = self._arm(model)
        with self._lock:
            self._gain[name] += max(0.0, float(reward)) if math.isfinite(reward) else 0.0
            self._costs[name].append(max(0.0, float(cost)))

    def stats(self) -> dict[str, dict[str, float]]:
        with self._lock:
            s, r = self.scores(), self.rates()
            return {
                m.name: {"pulls": self._pulls[m.name], "finished": len(self._costs[m.name]),
                         "gain": self._gain[m.name], "cost": sum(self._costs[m.name]), "rate": r[m.name],
                         "score": s[m.name]}
                for m in self.models
            }


# --------------------------------------------------------------------------------------
# Formatting helpers
# --------------------------------------------------------------------------------------

_ERR_LOC_RES = (
    re.compile(r"(?P<file>[^\s():]+)\((?P<line>\d+)\): (?:error|warning)"),  # nvcc
    re.compile(r"(?P<file>[^\s():]+):(?P<line>\d+):(?:\d+:)? (?:fatal )?error"),  # gcc/clang
    re.compile(r"\bline (?P<line>\d+)\b"),  # policy: "... at line 12"
)
_HEADER_RE = re.compile(r"\.(h|hpp|hxx|cuh|inl|inc)$|/include/|/cute/|/cutlass/")


def trim_error(text: str, max_lines: int = 40, max_chars: int = 4000) -> str:
    """The first ``max_lines`` lines / ``max_chars`` characters of an error text, marked if cut."""
    lines = (text or "").strip().splitlines()
    out = "\n".join(lines[:max_lines])
    cut = len(lines) > max_lines
    if len(out) > max_chars:
        out, cut = out[:max_chars], True
    return out + ("\n[... trimmed ...]" if cut else "")


def failing_lines(source: str, error_text: str, context: int = 2, max_locations: int = 6) -> str:
    """Numbered source excerpts around the lines an error text points at ("" if none).

    Understands nvcc (``file.cu(12): error``), gcc (``file.cu:12:5: error``) and policy
    (``line 12``) locations; locations inside headers (CuTe, CUTLASS) are skipped.
    """
    src = source.splitlines()
    found: list[int] = []
    for rx in _ERR_LOC_RES:
        for m in rx.finditer(error_text or ""):
            f = m.groupdict().get("file")
            if f and _HEADER_RE.search(f):
                continue
            ln = int(m.group("line"))
            if 1 <= ln <= len(src) and ln not in found:
                found.append(ln)
        if found:
            break
    found = found[:max_locations]
    if not found:
        return ""
    chunks = []
    for ln in found:
        a, z = max(1, ln - context), min(len(src), ln + context)
        chunks.append("\n".join(f"{'>>' if i == ln else '  '} {i:4d} | {src[i - 1]}" for i in range(a, z + 1)))
    return "\n...\n".join(chunks)


def _fmt_fitness(f: float | None) -> str:
    return "incorrect" if f is None else f"{f:.3f}"


def _excerpt(source: str, max_lines: int) -> str:
    lines = source.splitlines()
    if len(lines) <= max_lines:
        return source.rstrip("\n")
    return "\n".join(lines[:max_lines]) + f"\n// ... ({len(lines) - max_lines} more lines)"


def _fmt_profile(profile: dict[str, Any]) -> str:
    rows = []
    for k in sorted(profile):
        v = profile[k]
        if isinstance(v, float):
            v = f"{v:.4g}"
        rows.append(f"- {k}: {v}")
    return "\n".join(rows)


def _fmt_unmatched(blocks: Sequence[UnmatchedBlock]) -> str:
    out = []
    for i, u in enumerate(blocks, 1):
        closest = f"closest lines in the source (from line {u.closest_line}):\n```\n{u.closest_match_snippet.rstrip()}\n```" if u.closest_match_snippet else "no similar lines in the source"
        out.append(f"### Unmatched block {i} ({u.reason})\nSEARCH was:\n```\n{u.search_text.rstrip()}\n```\n{closest}")
    return "\n\n".join(out)


# --------------------------------------------------------------------------------------
# The mutator
# --------------------------------------------------------------------------------------


class LLMMutator:
    """The LLM mutator (see module docstring).

    ``max_response_kb``: answers larger than this are rejected (the client should also cap
    them; this guards replayed or custom clients). ``n_inspirations``: 0-3 inspirations in
    optimize prompts. ``unmatched_parents`` / ``unmatched_per_parent``: bounds of the
    per-parent memory of unmatched blocks. ``excerpt_lines``: inspiration source excerpt size.
    """

    name = "llm"
    #: Can write a first kernel from the task alone (``propose([])``).
    genesis = True
    #: ``None`` from ``propose`` is a failed attempt, not exhaustion: ask again later.
    exhaustive = False
    #: Engine stops after this many failed attempts in a run (0 = 3 x the evaluation budget).
    max_failed_attempts = 0

    def __init__(
        self,
        client: ChatClient,
        models: Sequence[ModelSpec],
        context_provider: PromptContextProvider,
        *,
        bandit: ModelBandit | None = None,
        attempt_sink: AttemptSink | None = None,
        max_response_kb: int = 256,
        n_inspirations: int = 2,
        unmatched_parents: int = 256,
        unmatched_per_parent: int = 4,
        excerpt_lines: int = 80,
        pending_max: int = 4096,
        health: ModelHealth | None = None,
        on_model_stop: StopSink | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not 0 <= n_inspirations <= 3:
            raise ValueError(f"n_inspirations={n_inspirations}: must be within [0, 3]")
        if not models:
            raise LLMConfigError("LLMMutator needs at least one model ([[llm.models]] is empty)")
        self.client = client
        self.models = tuple(models)
        self.provider = context_provider
        self.bandit = bandit if bandit is not None else ModelBandit(self.models)
        self.attempt_sink = attempt_sink
        self.max_response_bytes = int(max_response_kb) * 1024
        self.n_inspirations = n_inspirations
        self.excerpt_lines = excerpt_lines
        self._unmatched: OrderedDict[str, list[UnmatchedBlock]] = OrderedDict()
        self._unmatched_parents = unmatched_parents
        self._unmatched_per_parent = unmatched_per_parent
        self._pending: OrderedDict[str, tuple[str, float, float]] = OrderedDict()
        self._pending_max = pending_max
        self.last_failure: AttemptRecord | None = None
        self.attempts = 0
        self.failures = 0
        self.health = health if health is not None else ModelHealth(self.models)
        if on_model_stop is not None:
            self.health.on_stop = on_model_stop
        self._sleep = sleep
        self._lock = threading.RLock()

    def wants_parents(self) -> int:
        return 1

    # ---- engine feedback -----------------------------------------------------------------

    def observe(self, candidate_id: str, fitness: float | None) -> None:
        """Report the evaluated fitness of a child this mutator proposed (feeds the bandit).

        Reward = ``max(0, fitness - baseline)``; baseline = the parent's fitness for optimize,
        the fitness of the nearest correct ancestor for repair (a repair is credited with what
        its repaired lineage gained over the last correct kernel, not with the whole speedup),
        0 for genesis. An incorrect child earns 0. Unknown ids are ignored.
        """
        entry = self._pending.pop(candidate_id, None)
        if entry is None:
            return
        model, baseline, cost = entry
        reward = 0.0 if fitness is None or not math.isfinite(fitness) else max(0.0, fitness - baseline)
        if model in {m.name for m in self.bandit.models}:
            self.bandit.update(model, reward, cost)

    def unmatched_for(self, parent_id: str) -> tuple[UnmatchedBlock, ...]:
        """The remembered unmatched blocks of a parent (shown in its next prompt)."""
        return tuple(self._unmatched.get(parent_id, ()))

    # ---- propose -------------------------------------------------------------------------

    def propose(self, parents: list[Member], context: MutationContext, rng: random.Random) -> Proposal | None:
        parent = parents[0] if parents else None
        if parent is None:
            kind = "genesis"
        elif not parent.correct:
            kind = "repair"
        else:
            kind = "optimize"
        model = self._choose_model(rng)  # may raise NoModelLeft
        messages = self._messages(kind, parent, context)
        call = self.client.complete(messages, model=model, kind=kind)  # may raise BudgetExhausted
        self.health.record(model.name, call)
        self.attempts += 1
        pid = parent.id if parent is not None else None
        problems, unmatched, child = self._child_from(kind, parent, call)
        params: dict[str, str] = {}
        cid = None
        if child is not None and not problems:
            params = self._params_for(child, parent)
            cid = candidate_id(child, canonical_params(params), context.task)
            if cid in context.seen:
                problems.append("duplicate: this child was already proposed in this run")
        if problems or child is None:
            self._fail(kind, pid, model, call, problems or ["no child produced"], unmatched)
            return None
        if pid is not None:
            self._unmatched.pop(pid, None)
        assert cid is not None
        self._pending[cid] = (model.name, self._baseline(kind, parent), call.cost)
        while len(self._pending) > self._pending_max:
            self._pending.popitem(last=False)
        rec = AttemptRecord(kind=kind, parent_id=pid, model=model.name, ok=True, prompt_hash=call.prompt_hash,
                            candidate_id=cid, cost=call.cost)
        if self.attempt_sink is not None:
            self.attempt_sink(rec)
        return Proposal(
            source=child,
            params=params,
            parents=(pid,) if pid is not None else (),
            operator=f"llm:{model.name}",
            notes=f"{kind} by {model.name} (prompt {call.prompt_hash[:12]}, ${call.cost:.4f})",
        )

    # ---- internals -----------------------------------------------------------------------

    def _choose_model(self, rng: random.Random) -> ModelSpec:
        """The bandit's pick among the models :class:`ModelHealth` allows.

        Raises :class:`NoModelLeft` when every model is stopped. When every live model's
        breaker is open, waits for the earliest cooldown (``sleep``) and tries that model.
        """
        names = [m.name for m in self.bandit.models]
        while True:
            self.health.check(names)
            usable = [n for n in self.health.usable() if n in names]
            if usable:
                break
            wait = self.health.wait_s()
            log.warning("every LLM model's circuit breaker is open; waiting %.0f s before trying again", wait)
            self._sleep(wait)
            self.health.force_half_open()
        with self._lock:
            model = self.bandit.choose(rng, among=usable)
        self.health.chose(model.name)
        return model

    def _messages(self, kind: str, parent: Member | None, context: MutationContext) -> list[dict[str, str]]:
        info = self.provider.task_info(context.task)
        common = {
            "task": context.task,
            "dtype": info.dtype,
            "shapes_text": info.shapes_text,
            "tolerance_text": info.tolerance_text,
        }
        if kind == "genesis":
            return render_prompt(kind, **common, reference_src=info.reference_src.rstrip(),
                                 abi_text=info.abi_text.rstrip(), sol_text=info.sol_text or None)
        assert parent is not None
        src = parent.candidate.source.rstrip("\n")
        unmatched = self.unmatched_for(parent.id)
        unmatched_text = _fmt_unmatched(unmatched) if unmatched else None
        if kind == "repair":
            fail = self.provider.failure(parent.id)
            if fail is None:
                fail = ("unknown", parent.status.value if hasattr(parent.status, "value") else str(parent.status), parent.error)
            stage, status, err = fail
            return render_prompt(
                kind, **common, parent_source=src, stage=stage or "unknown", status=status or "failed",
                error_text=trim_error(err) or "(no error text was recorded)",
                failing_lines=failing_lines(parent.candidate.source, err) or None, unmatched=unmatched_text,
            )
        history = self.provider.history(parent.id)
        history_text = "\n".join(f"- generation {g}: {_fmt_fitness(f)}" for g, f in history) or \
            f"- generation {parent.candidate.generation}: {_fmt_fitness(parent.fitness)}"
        insp = self.provider.inspirations(context.task, context.island, self.n_inspirations) if self.n_inspirations else []
        insp_text = "\n\n".join(
            f"### Inspiration {i} (speedup {_fmt_fitness(f)})\n```cuda\n{_excerpt(s, self.excerpt_lines)}\n```"
            for i, (s, f) in enumerate(insp[: self.n_inspirations], 1)
        ) or None
        prof = self.provider.profile(parent.id)
        return render_prompt(
            kind, **common, parent_source=src, parent_fitness=_fmt_fitness(parent.fitness), history_text=history_text,
            sol_text=info.sol_text or None, inspirations=insp_text,
            profile=_fmt_profile(prof) if prof else None, unmatched=unmatched_text,
        )

    def _child_from(
        self, kind: str, parent: Member | None, call: LLMCall
    ) -> tuple[list[str], tuple[UnmatchedBlock, ...], str | None]:
        if call.error is not None:
            return [f"call failed: {call.error}"], (), None
        raw = call.response or ""
        if len(raw.encode("utf-8")) > self.max_response_bytes:
            return [f"answer too large: {len(raw.encode('utf-8'))} bytes > {self.max_response_bytes}"], (), None
        text, think_note = strip_reasoning(raw)
        cut = call.finish_reason == "length"
        if not text.strip():
            if think_note or (cut and raw.strip()):
                return [f"empty answer: {think_note or 'only reasoning came back'}; the answer was cut at "
                        "max_output_tokens before any code"], (), None
            if cut or call.reasoning_tokens:
                return [f"empty answer: the model spent its output tokens ({call.tokens_out}, "
                        f"{call.reasoning_tokens} of them reasoning) before writing an answer (finish_reason "
                        f"{call.finish_reason}); raise max_output_tokens or lower reasoning_effort"], (), None
            return ["empty answer"], (), None
        note = " (the answer was cut at max_output_tokens)" if cut else ""
        if kind == "genesis":
            whole = extract_whole_file(text)
            if whole is None:
                return [f"genesis answer has no ```cuda file defining evo_launch{note}"], (), None
            return validate_child(None, whole, whole_file=True, allow_whole_file=True), (), whole
        assert parent is not None
        parsed = parse_blocks(text)
        problems = [f"broken SEARCH/REPLACE block at {e}{note}" for e in parsed.errors]
        if not parsed.blocks:
            whole = extract_whole_file(text)
            if whole is not None:
                problems += validate_child(parent.candidate.source, whole, whole_file=True, allow_whole_file=False)
                return problems, (), whole
            if not problems:
                problems.append(f"no SEARCH/REPLACE blocks in the answer (prose only){note}")
            return problems, (), None
        if problems:
            return problems, (), None
        res = apply_blocks(parent.candidate.source, parsed.blocks)
        if res.unmatched:
            self._remember(parent.id, res.unmatched)
            return [f"{len(res.unmatched)} of {len(parsed.blocks)} SEARCH blocks matched nowhere"], res.unmatched, None
        return validate_child(parent.candidate.source, res.source), (), res.source

    def _baseline(self, kind: str, parent: Member | None) -> float:
        """What a child must beat to earn bandit reward (see :meth:`observe`)."""
        if parent is None:
            return 0.0
        if parent.correct and parent.fitness is not None:
            return float(parent.fitness)
        fits = [f for _, f in self.provider.history(parent.id) if f is not None]
        return float(fits[-1]) if fits else 0.0

    def _params_for(self, child: str, parent: Member | None) -> dict[str, str]:
        """The parent's tunable values that the child still declares and allows."""
        if parent is None:
            return {}
        declared = {t.name: t for t in parse_tunables(child)}
        keep = {k: v for k, v in parent.candidate.params_dict.items() if k in declared and v in declared[k].choices}
        try:
            return {k: v for k, v in resolve_params(child, keep).items() if k in keep}
        except TunableError:  # pragma: no cover - filtered above
            return {}

    def _remember(self, parent_id: str, blocks: Sequence[UnmatchedBlock]) -> None:
        lst = self._unmatched.pop(parent_id, [])
        lst = (lst + list(blocks))[-self._unmatched_per_parent:]
        self._unmatched[parent_id] = lst
        while len(self._unmatched) > self._unmatched_parents:
            self._unmatched.popitem(last=False)

    def _fail(self, kind: str, pid: str | None, model: ModelSpec, call: LLMCall, problems: list[str],
              unmatched: tuple[UnmatchedBlock, ...]) -> None:
        self.failures += 1
        self.bandit.update(model, 0.0, call.cost)
        rec = AttemptRecord(kind=kind, parent_id=pid, model=model.name, ok=False, problems=tuple(problems),
                            unmatched=unmatched, prompt_hash=call.prompt_hash, cost=call.cost, call_error=call.error)
        self.last_failure = rec
        log.info("LLM %s attempt by %s for %s rejected: %s", kind, model.name, (pid or "-")[:12], "; ".join(problems))
        if self.attempt_sink is not None:
            self.attempt_sink(rec)
