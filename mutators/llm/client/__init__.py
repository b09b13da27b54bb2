"""The endpoint side: a model's spec, calls as data, the shared budget, what HTTP errors
mean, the client (chat completions and the Responses API), what a server says about its
models (served) and its count of a prompt's tokens (tokenize: vLLM's /tokenize), and model
health."""
