"""Joining a cluster that is not there fails within seconds, naming the address as typed.

Ray's own ``ray.init(address=...)`` retries a dead address for many minutes (829 s measured
in issue 34) and names the address as it rewrote it; :func:`evo.engine.runtime.probe_cluster_address`
checks the address first. No GPU, no Ray cluster needed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from evo.engine.runtime import RuntimeError_, probe_cluster_address

ROOT = Path(__file__).resolve().parents[1]


def _dead_port() -> int:
    """A local port with nothing listening (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refused_address_fails_at_once_naming_it_and_how_to_check():
    port = _dead_port()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError_) as ei:
        probe_cluster_address(f"127.0.0.1:{port}")
    assert time.monotonic() - t0 < 2
    msg = str(ei.value)
    assert f"'127.0.0.1:{port}'" in msg and f"ray status --address 127.0.0.1:{port}" in msg
    assert "refused" in msg.lower()


def test_silent_listener_times_out_within_the_probe_timeout():
    # Accepts TCP (the kernel's backlog) but never answers the HTTP/2 preface.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    try:
        addr = f"127.0.0.1:{srv.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(RuntimeError_, match="does not answer as a Ray cluster"):
            probe_cluster_address(addr, timeout_s=0.5)
        assert time.monotonic() - t0 < 3
    finally:
        srv.close()


def test_a_grpc_like_server_passes_the_probe():
    # Answers the client preface with an (empty) HTTP/2 SETTINGS frame, as a gRPC server does.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            got.append(conn.recv(64))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        probe_cluster_address(f"127.0.0.1:{srv.getsockname()[1]}", timeout_s=2)
        t.join(5)
        assert got and got[0].startswith(b"PRI * HTTP/2.0")
    finally:
        srv.close()


@pytest.mark.parametrize("addr", ["nocolon", "host:port", ":6379"])
def test_malformed_address_says_what_is_expected(addr):
    with pytest.raises(RuntimeError_, match="expected HOST:PORT"):
        probe_cluster_address(addr)


def test_evo_search_against_a_dead_cluster_fails_in_seconds(tmp_path):
    """The real command, in a fresh process, as a user runs it (issue 34: 829 s before)."""
    port = _dead_port()
    env = {**os.environ, "EVO_LOG": str(tmp_path / "evo.log")}
    env.pop("RAY_ADDRESS", None)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "evo.cli", "search", "configs/demo.toml", "--address",
                        f"127.0.0.1:{port}", "--db", str(tmp_path / "evo.db"), "--no-progress"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert wall < 30, f"took {wall:.1f} s"
    assert f"127.0.0.1:{port}" in out and f"ray status --address 127.0.0.1:{port}" in out, out
    assert "Traceback" not in out and "rpc_client" not in out, out
