"""The endpoint side: a model's spec, calls as data, the shared budget, what HTTP errors
mean, the chat-completions client and model health."""
