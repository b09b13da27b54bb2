"""Record/replay of LLM calls (cassette) and the local OpenAI-compatible fake endpoint
(fake_server)."""
