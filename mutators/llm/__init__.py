"""The LLM mutator and its parts, by subject (docs/llm.md):

- :mod:`mutators.llm.mutator`: :class:`~mutators.llm.mutator.LLMMutator`, a coordinator
  built from :class:`~mutators.llm.mutator.LLMMutatorSettings` over the attempt records and
  memory (:mod:`~mutators.llm.attempts`), the repair queue (:mod:`~mutators.llm.repairs`),
  the model choice (:mod:`~mutators.llm.bandit`) and the prompt builder
  (:mod:`~mutators.llm.prompt.builder`);
- :mod:`mutators.llm.prompt`: what a prompt knows and says (templates in ``prompt/prompts/``);
- :mod:`mutators.llm.answer`: a model's answer -> a child source (SEARCH/REPLACE patches);
- :mod:`mutators.llm.client`: the endpoint (model specs, calls, budget, HTTP errors, the
  client, model health);
- :mod:`mutators.llm.replay`: record/replay cassettes and the local fake endpoint.

Nothing is imported here: ``import mutators.llm.client.model_spec`` (done by the config)
loads only what it needs.
"""
