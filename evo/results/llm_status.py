"""What the LLM mutator did in a run, per model: :func:`llm_status` (the ``llm`` part of
``evo status``).

Read from what :class:`evo.engine.llm_records.LLMRecorder` stored: the ``llm_calls`` rows
(calls, errors, retries, tokens, spend: :meth:`evo.store.StoreReader.llm_by_model`), the
``llm_attempt`` events (children made, repairs, attempts that made no child counted by
their :data:`mutators.llm.answer.reasons.REASONS` code) and the ``llm_model_stopped``
events (stopped models and why); the budget is the run's ``[llm] budget_usd``.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from evo.store import StoreReader

__all__ = ["llm_status"]

_ATTEMPT, _STOPPED = "llm_attempt", "llm_model_stopped"


def llm_status(store: "StoreReader", run_id: str, config: Mapping[str, Any],
               events: Iterable[Mapping[str, Any]] | None = None) -> dict[str, Any] | None:
    """The run's LLM activity, or None for a run that has none (no call, no attempt and an
    other mutator configured).

    ``events`` are the run's events if the caller holds them (else they are read).
    Returns ``{"budget_usd", "spent", "budget_left", "models": [...]}`` (``budget_usd`` and
    ``budget_left`` None when the config names no budget); each model, in the config's
    order, then any other name met: ``{"model", "calls", "call_errors", "retries",
    "tokens_in", "tokens_out", "cost", "attempts", "children", "repairs", "repair_attempts",
    "rejected": {reason: n}, "no_answer": {reason: n}, "stopped": reason line or None}``.
    ``rejected`` counts answers refused before compiling, ``no_answer`` attempts that got
    none (not sent, over the window, the call failed); ``children`` the attempts whose answer
    became a candidate, ``repairs`` those of them that repaired a broken kernel.
    """
    from mutators.llm.answer.reasons import NOT_ANSWERED, reason_of

    evs = list(events) if events is not None else store.events(run_id)
    attempts = [e["payload"] for e in evs if e["kind"] == _ATTEMPT]
    stops = {str(e["payload"].get("model")): str(e["payload"].get("reason") or "")
             for e in evs if e["kind"] == _STOPPED}
    calls = store.llm_by_model(run_id)
    llm_cfg = config.get("llm") or {}
    uses_llm = (config.get("mutator") or {}).get("kind") == "llm"
    if not (calls or attempts or stops or uses_llm):
        return None
    names = [str(m.get("name")) for m in llm_cfg.get("models") or () if m.get("name")]
    for name in [*calls, *(str(a.get("model")) for a in attempts), *stops]:
        if name not in names:
            names.append(name)
    models = []
    for name in names:
        mine = [a for a in attempts if str(a.get("model")) == name]
        made = [a for a in mine if a.get("ok")]
        failed = Counter(reason_of(a) for a in mine if not a.get("ok"))
        c = calls.get(name, {})
        models.append({
            "model": name,
            "calls": c.get("n_calls", 0), "call_errors": c.get("n_errors", 0), "retries": c.get("retries", 0),
            "tokens_in": c.get("tokens_in", 0), "tokens_out": c.get("tokens_out", 0), "cost": c.get("cost", 0.0),
            "attempts": len(mine),
            "children": len(made),
            "repairs": sum(1 for a in made if a.get("kind") == "repair"),
            "repair_attempts": sum(1 for a in mine if a.get("kind") == "repair"),
            "rejected": {r: n for r, n in sorted(failed.items()) if r not in NOT_ANSWERED},
            "no_answer": {r: n for r, n in sorted(failed.items()) if r in NOT_ANSWERED},
            "stopped": stops.get(name),
        })
    spent = float(sum(m["cost"] for m in models))
    budget = llm_cfg.get("budget_usd")
    return {
        "budget_usd": float(budget) if budget is not None else None,
        "spent": spent,
        "budget_left": max(0.0, float(budget) - spent) if budget is not None else None,
        "models": models,
    }
