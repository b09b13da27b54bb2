"""``torch`` and ``torch.nn.functional`` for the task modules, imported on first use.

The task suite is read by processes that never run a reference (``evo search``'s driver loads
the config and the tasks' shapes, counts and seeds; the compile workers read a seed's
source): torch's import costs them seconds, and in the driver it competes with the start of
the local Ray instance begun at the command's entry (:mod:`evo.engine.early_ray`). The task
modules therefore name torch through these stand-ins, which import the real module the
first time an attribute is read (a reference run, an input draw, a tolerance check) and
behave as it from then on. Nothing is read at a task module's import.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

__all__ = ["torch", "F", "LazyModule"]


class LazyModule(types.ModuleType):
    """A module imported by the first attribute read (``torch.float32`` imports torch)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__dict__["_lazy_name"] = name

    def _load(self) -> types.ModuleType:
        """The real module, imported the first time and kept (every later attribute read is
        one lookup: the task modules' functions run in the judge's timing loop). Attributes
        are read from it each time, so a value set on the module later is seen."""
        mod = self.__dict__.get("_lazy_module")
        if mod is None:
            mod = self.__dict__["_lazy_module"] = importlib.import_module(self.__dict__["_lazy_name"])
        return mod

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return getattr(self._load(), attr)

    def __dir__(self) -> list[str]:
        return dir(self._load())


torch: Any = LazyModule("torch")
F: Any = LazyModule("torch.nn.functional")
