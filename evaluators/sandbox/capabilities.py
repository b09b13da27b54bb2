"""Which confinement layers this machine allows (:func:`probe`, once per process): a network
namespace (as root or inside a user namespace), the Landlock ABI, whether RLIMIT_NPROC is
enforced. The probe runs the very same wrapper, so a layer that is used is known to work;
each missing layer is logged once as a WARNING.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from evaluators.sandbox.landlock import _landlock_abi
from evaluators.sandbox.wrapper import _NETNS_CHECK, _wrapper_argv

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Capabilities:
    """What this machine lets an unprivileged-by-design child do to itself (probed once).

    ``netns``: ``"root"`` (plain network namespace), ``"userns"`` (inside a user namespace)
    or ``""`` (refused). ``landlock_abi``: 0 when Landlock is unavailable. ``is_root``:
    RLIMIT_NPROC is not enforced for root. ``notes``: why a layer is missing.
    """

    netns: str
    landlock_abi: int
    is_root: bool
    notes: tuple[str, ...] = ()


def _try_netns(mode: str) -> tuple[bool, str]:
    """Run the wrapper in ``mode`` around a check that it sees no interface but lo."""
    with tempfile.TemporaryDirectory(prefix="evo-sandbox-probe-") as d:
        argv = _wrapper_argv({"netns": mode, "jobdir": d}, [sys.executable, "-I", "-S", "-c", _NETNS_CHECK])
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            return False, f"{mode}: {e}"
    if p.returncode == 0:
        return True, ""
    return False, f"{mode}: " + ((p.stderr or "").strip().splitlines() or [f"exit {p.returncode}"])[-1][:300]


_probe_lock = threading.Lock()
_probed: Capabilities | None = None


def reset_probe() -> None:
    """Forget the cached probe (tests; or after the machine's policy changed)."""
    global _probed
    with _probe_lock:
        _probed = None


def probe() -> Capabilities:
    """Detect, once per process, which layers this kernel allows; log one WARNING per gap."""
    global _probed
    with _probe_lock:
        if _probed is not None:
            return _probed
        t0 = time.monotonic()
        notes: list[str] = []
        netns = ""
        errs = []
        for mode in ("root", "userns"):
            ok, why = _try_netns(mode)
            if ok:
                netns = mode
                break
            errs.append(why)
        abi = _landlock_abi()
        is_root = os.geteuid() == 0
        if not netns:
            notes.append("no network namespace (" + "; ".join(errs) + ")")
            log.warning(
                "SANDBOX: network namespaces are not available here (%s); candidates are NOT cut off "
                "from the network%s. Run on a host or container that allows unshare(CLONE_NEWNET) "
                "(root, CAP_SYS_ADMIN, or unprivileged user namespaces) for full isolation.",
                "; ".join(errs),
                " except that Landlock denies TCP connect/bind (UDP stays open)" if abi >= 4 else "",
            )
        if abi == 0:
            notes.append("no Landlock")
            log.warning("SANDBOX: Landlock is not available in this kernel: no signal scoping, no TCP "
                        "fallback, no read or write protection outside the job directory")
        elif abi < 6:
            notes.append(f"Landlock ABI {abi} < 6: no signal scoping")
        if is_root:
            notes.append("running as root: RLIMIT_NPROC is not enforced")
            # Short enough for one line of an 80-column terminal; the detail goes to the log file.
            log.warning("sandbox: as root, RLIMIT_NPROC is not enforced; run as a non-root user")
            log.info("sandbox: RLIMIT_NPROC is not enforced for root, so a fork bomb is bounded only "
                     "by the wall-clock timeout; run the search as a dedicated non-root user")
        _probed = Capabilities(netns=netns, landlock_abi=abi, is_root=is_root, notes=tuple(notes))
        log.info("sandbox probe (%.2fs): netns=%s landlock_abi=%d root=%s", time.monotonic() - t0,
                 netns or "unavailable", abi, is_root)
        return _probed
