"""Finished profiles cached by (sha256 of the .so, shape, GPU name, metric list) in small
JSON files (:class:`ProfileCache`); the store is the record, the cache an optimisation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from evaluators.profile.settings import DEFAULT_METRICS, SUMMARY_VERSION

log = logging.getLogger(__name__)


def profile_key(so_sha256: str, shape: Mapping[str, int], gpu: str, metrics: Sequence[str] = DEFAULT_METRICS) -> str:
    """Cache key: binary hash, shape, GPU name, and the metric list + summary version."""
    h = hashlib.sha256()
    h.update(json.dumps([so_sha256, sorted((str(k), int(v)) for k, v in shape.items()), gpu,
                         sorted(metrics), SUMMARY_VERSION]).encode())
    return h.hexdigest()


class ProfileCache:
    """Finished profiles as ``<dir>/<key[:2]>/<key>.json``; writes are atomic (tmp + rename).

    A corrupt file counts as a miss (and is overwritten by the next profile); the cache is
    an optimisation, the store is the record.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)

    def _path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        p = self._path(key)
        try:
            return json.loads(p.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("ignoring unreadable profile cache entry %s: %s", p, e)
            return None

    def put(self, key: str, metrics: Mapping[str, Any]) -> None:
        p = self._path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dict(metrics), sort_keys=True))
        os.replace(tmp, p)
