"""When to profile and when to tune: pure rules the engine asks after each recorded member.

No I/O, no Ray, no clock: each rule is a function of the member, the island's current
ranking and what was already done, so it is tested exhaustively in CI and the engine stays
orchestration only. Settings are duck-typed (``evaluators.profile.ProfileSettings`` and
``evo.tuning.TuningSettings`` fit), so this module imports neither ncu nor Optuna code.

Why delayed profiling: ncu costs seconds to tens of seconds per candidate (the kernel is
replayed once per metric pass), while most children never matter. Profiling only correct
candidates that enter their island's top-k spends that cost where the next prompts come
from. Why late feedback (``profile.feedback_after``, default 3): the CuTeGen study found
that profile numbers shown from the first generation pull the model into micro-tuning a
structure that is still wrong (tile shapes and launch parameters of a kernel whose data
flow will change anyway), while the same numbers after the structure has stabilised (a few
generations of correct descendants) guide real improvements. The default of 3 lets the
seed's first children and grandchildren change structure first.
"""

from __future__ import annotations

from typing import Any, Collection, Sequence

from evo.records import Member, Operator

__all__ = [
    "DEFAULT_FEEDBACK_AFTER",
    "profile_key_of",
    "should_profile",
    "profile_visible",
    "has_tunables",
    "should_tune",
]

#: Lineage depth from which prompts may quote profile numbers (see the module docstring).
DEFAULT_FEEDBACK_AFTER = 3


def profile_key_of(member: Member, shape: str, gpu: str) -> str:
    """Identity of one profile for :func:`should_profile`'s ``done`` set.

    The candidate id stands for the binary: same source + tunables + task with the same
    compile flags gives the same .so (the compile cache is keyed the same way); the
    profiler's own cache additionally keys on the binary's sha256.
    """
    return f"{member.id}|{shape}|{gpu}"


def should_profile(
    member: Member,
    island_topk_ids: Sequence[str],
    settings: Any,
    *,
    done: Collection[str] = (),
    shape: str = "",
    gpu: str = "",
) -> bool:
    """Profile ``member`` now?

    True when profiling is enabled, the member is correct, it is among the first
    ``settings.top_k`` ids of ``island_topk_ids`` (its island's ranking, best first, as it
    stands after the member was added), and :func:`profile_key_of` (member, shape, gpu) is
    not in ``done`` (never twice for the same binary, shape and GPU).
    """
    if not getattr(settings, "enabled", True) or not member.correct:
        return False
    k = int(getattr(settings, "top_k", 3))
    if member.id not in list(island_topk_ids)[:k]:
        return False
    return profile_key_of(member, shape, gpu) not in done


def profile_visible(depth: int, feedback_after: int = DEFAULT_FEEDBACK_AFTER) -> bool:
    """May a prompt for a parent at lineage ``depth`` quote profile numbers?

    ``depth`` is the parent's generation (seed = 0, each mutation + 1: ``Candidate.generation``).
    True from ``depth >= feedback_after`` on; a negative ``feedback_after`` never shows them.
    """
    if feedback_after < 0:
        return False
    return depth >= feedback_after


def has_tunables(source: str) -> bool:
    """Does ``source`` declare a tunable with more than one choice? (False if it cannot parse.)"""
    from evo.tunables import TunableError, parse_tunables

    try:
        return any(len(t.choices) > 1 for t in parse_tunables(source))
    except TunableError:
        return False


def should_tune(member: Member, topk: Sequence[str], tuned_ids: Collection[str], settings: Any) -> bool:
    """Open a tuning study for ``member`` now?

    True when tuning is enabled with a positive ``settings.trials_per_survivor``, the member
    is correct, among the first ``settings.top_k`` of ``topk`` (its island's ranking, best
    first), declares tunables with a choice to make, was not tuned already (``tuned_ids``:
    parent ids of existing studies), and is not itself an Optuna trial (its tunables were
    just searched; its parent's study covers it).
    """
    if not getattr(settings, "enabled", True) or int(getattr(settings, "trials_per_survivor", 0)) <= 0:
        return False
    if not member.correct or member.id in tuned_ids:
        return False
    if member.candidate.operator == Operator.OPTUNA.value:
        return False
    k = int(getattr(settings, "top_k", 2))
    if member.id not in list(topk)[:k]:
        return False
    return has_tunables(member.candidate.source)
