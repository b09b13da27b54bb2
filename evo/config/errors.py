"""The one error of configuration: a file or override is wrong, one line per problem."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A configuration file or override is wrong; the message says where and how to fix it.

    ``source`` is the file as the user named it (or ``<config>`` for in-memory data);
    ``problems`` holds ``(dotted_key, message)`` pairs, one per mistake (``key`` is ``""``
    for file-level problems such as a missing file or a TOML syntax error).
    """

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = list(problems)
        super().__init__("\n".join(f"{source}: {msg}" for _, msg in self.problems))
