"""Mutators turn parents into child proposals: the offline ``knobs`` mutator (default) and,
through an OpenAI-compatible endpoint, the LLM mutator (the package ``mutators.llm``). See
mutators/base.py for the contract."""

from mutators.base import MutationContext, Mutator, Proposal
from mutators.knobs import KnobsMutator

__all__ = ["MutationContext", "Mutator", "Proposal", "KnobsMutator"]
