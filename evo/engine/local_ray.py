"""What a local Ray instance is started with (:class:`LocalRaySettings`), read from a validated
config or, before the config is validated, from its raw TOML (:func:`read_raw_ray`).

The raw read exists so that ``evo search`` can begin a local instance's start before loading
the config (:mod:`evo.engine.early_ray`): it reads only ``[ray] address,
num_cpus, num_gpus`` and ``[llm] models[*].key_env`` with :mod:`tomllib`, validates nothing
else and imports nothing heavy. Anything it does not understand gives None (no early start):
the config's own load then reports the mistake as it always does. Importing this module
loads neither Ray nor torch.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

__all__ = ["LocalRaySettings", "RawRay", "read_raw_ray"]


@dataclass(frozen=True)
class LocalRaySettings:
    """The arguments of a local instance's ``ray.init`` (:meth:`init_kwargs`), and the
    environment variables kept out of its processes.

    ``num_cpus`` / ``num_gpus``: None = Ray's own count (the config's ``"auto"``).
    ``secret_env``: names that hold secrets without looking like it (the LLM models'
    ``key_env``); with every secret-looking name they are withheld from the instance
    (:func:`evaluators.sandbox.secrets_withheld`).
    """

    num_cpus: int | None = None
    num_gpus: int | None = None
    secret_env: tuple[str, ...] = ()

    def init_kwargs(self) -> dict[str, Any]:
        """``ray.init``'s keyword arguments: no dashboard, workers' logs not sent to the driver,
        and the counts that are set."""
        kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if self.num_cpus is not None:
            kw["num_cpus"] = self.num_cpus
        if self.num_gpus is not None:
            kw["num_gpus"] = self.num_gpus
        return kw

    @classmethod
    def of_config(cls, cfg) -> "LocalRaySettings":
        """The settings of a validated :class:`evo.config.Config` (a knobs config has no
        ``[llm]`` section: no extra secret names)."""
        return cls(num_cpus=None if cfg.ray.num_cpus == "auto" else int(cfg.ray.num_cpus),
                   num_gpus=None if cfg.ray.num_gpus == "auto" else int(cfg.ray.num_gpus),
                   secret_env=tuple(m.key_env for m in (cfg.llm.models if cfg.llm else ()) if m.key_env))


@dataclass(frozen=True)
class RawRay:
    """What the raw TOML says about Ray: ``address`` (``""``: none, a local instance) and the
    settings a local instance would get."""

    address: str
    settings: LocalRaySettings


#: the smallest count each ``[ray]`` key takes (evo.config.sections.RayConfig)
_MINIMUM = {"num_cpus": 1, "num_gpus": 0}


def _count(section: Mapping[str, Any], key: str) -> tuple[bool, int | None]:
    """(understood, value) of a ``[ray]`` count: absent or ``"auto"`` -> None, an integer at
    least its minimum -> itself; anything else is not understood."""
    v = section.get(key, "auto")
    if v == "auto" and isinstance(v, str):
        return True, None
    if isinstance(v, int) and not isinstance(v, bool) and v >= _MINIMUM[key]:
        return True, v
    return False, None


def read_raw_ray(path: str | Path) -> RawRay | None:
    """The Ray part of the TOML config at ``path``, read without validating the config; None
    when the file cannot be read or parsed, or any of the keys read has a value the config
    would refuse or convert (the config's load reports it)."""
    try:
        data = tomllib.loads(Path(path).read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    ray = data.get("ray", {})
    llm = data.get("llm", {})
    if not isinstance(ray, dict) or not isinstance(llm, dict):
        return None
    address = ray.get("address", "")
    if not isinstance(address, str):
        return None
    (cpus_ok, cpus), (gpus_ok, gpus) = _count(ray, "num_cpus"), _count(ray, "num_gpus")
    models = llm.get("models", [])
    if not (cpus_ok and gpus_ok) or not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
        return None
    key_env = [m["key_env"] for m in models if "key_env" in m]
    if not all(isinstance(k, str) for k in key_env):
        return None
    return RawRay(address=address,
                  settings=LocalRaySettings(num_cpus=cpus, num_gpus=gpus, secret_env=tuple(k for k in key_env if k)))
