"""A TCP listener on the host's loopback, for tests proving that a sandboxed candidate cannot
reach the network (and that an unsandboxed one can): it counts connections (``accepted``) and
keeps the first bytes each one sent (``got``)."""

from __future__ import annotations

import socket
import threading


class TcpListener:
    """Listen on 127.0.0.1:``port`` (0 = any free port, see ``.port``) until ``close()``."""

    def __init__(self, port: int = 0) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.got: list[bytes] = []
        self._stop = False
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            c.settimeout(2)
            try:
                self.got.append(c.recv(1000))
            except OSError:  # the peer closed or sent nothing: counted, no bytes
                pass
            c.close()

    def close(self) -> None:
        self._stop = True
        self.t.join(2)
        self.sock.close()
