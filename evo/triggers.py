"""When to profile and when to tune: the rules now live in :mod:`evo.survivors`.

This module keeps the old import path (``evo.llm_context`` and tests read the rules from
here); new code imports from :mod:`evo.survivors`.
"""

from __future__ import annotations

from evo.survivors import (
    DEFAULT_FEEDBACK_AFTER,
    has_tunables,
    profile_key_of,
    profile_visible,
    should_profile,
    should_tune,
)

__all__ = [
    "DEFAULT_FEEDBACK_AFTER",
    "profile_key_of",
    "should_profile",
    "profile_visible",
    "has_tunables",
    "should_tune",
]
