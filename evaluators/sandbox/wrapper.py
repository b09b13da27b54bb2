"""The exec wrapper: ``python -I -S -c WRAPPER CONFIG argv...`` confines itself (rlimits,
OOM score, a network namespace, Landlock) and then ``execv``\\ s the real child, so the
confinement is inherited by the harness, the candidate's ``.so`` and anything they start. If
it cannot confine itself it writes ``error.json`` and exits :data:`_SETUP_FAILED_EXIT`: the
candidate never runs unconfined by accident.
"""

from __future__ import annotations

import json
import sys
from typing import Sequence

from evaluators.sandbox.landlock import LANDLOCK_CODE


#: Exit code of the wrapper when it cannot confine itself (== protocol.HARNESS_BUG_EXIT).
_SETUP_FAILED_EXIT = 70


# Runs as ``python -I -S -c _WRAPPER CONFIG_JSON argv...``: confine, then exec argv.
# Standard library only; Python 3.8+; syscall numbers 444-446 are the same on every arch.
_WRAPPER_HEAD = r'''
import ctypes, json, os, resource, stat, struct, sys, traceback
cfg = json.loads(sys.argv[1])
argv = sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def fail(what):
    msg = "sandbox setup failed at %s: %s" % (what, traceback.format_exc(limit=2).strip().splitlines()[-1])
    sys.stderr.write(msg + "\n")
    os._exit(70)
def check(r, what):
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))
    return r
'''


_WRAPPER_BODY = r'''
step = "rlimits"
try:
    for name, soft, hard in cfg.get("rlimits", []):
        res = getattr(resource, name)
        cur_soft, cur_hard = resource.getrlimit(res)
        if cur_hard != resource.RLIM_INFINITY:
            hard = min(hard, cur_hard)
            soft = min(soft, hard)
        resource.setrlimit(res, (soft, hard))
    step = "oom_score_adj"
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    mode = cfg.get("netns", "")
    if mode:
        step = "network namespace (%s)" % mode
        CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
        if mode == "root":
            check(libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        elif mode == "userns":
            uid, gid = os.getuid(), os.getgid()
            check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNET), "unshare(CLONE_NEWUSER|CLONE_NEWNET)")
            with open("/proc/self/setgroups", "w") as f:
                f.write("deny")
            with open("/proc/self/uid_map", "w") as f:
                f.write("%d %d 1" % (uid, uid))
            with open("/proc/self/gid_map", "w") as f:
                f.write("%d %d 1" % (gid, gid))
        else:
            raise ValueError("unknown netns mode %r" % mode)
    ll = cfg.get("landlock")
    if ll:
        step = "landlock"
        landlock_apply(libc, ll, check)
except BaseException:
    fail(step)
try:
    os.execv(argv[0], argv)
except BaseException:
    fail("exec %r" % (argv[:1],))
'''
_WRAPPER = _WRAPPER_HEAD + LANDLOCK_CODE + _WRAPPER_BODY
# A child used by the probe: exits 0 inside an isolated network namespace.
_NETNS_CHECK = (
    "import socket, sys\n"
    "names = [n for _, n in socket.if_nameindex()]\n"
    "sys.exit(0 if names in ([], ['lo']) else 3)\n"
)


def _wrapper_argv(cfg: dict, argv: Sequence[str]) -> list[str]:
    return [sys.executable, "-I", "-S", "-c", _WRAPPER, json.dumps(cfg), *argv]
