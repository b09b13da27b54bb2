"""A TCP listener on the host's loopback that counts connections, for tests proving that a
sandboxed candidate cannot reach the network (and that an unsandboxed one can)."""

from __future__ import annotations

import socket
import threading


class TcpListener:
    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.accepted = 0
        self._stop = False
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                c, _ = self.sock.accept()
                self.accepted += 1
                c.close()
            except OSError:
                continue

    def close(self) -> None:
        self._stop = True
        self.t.join(2)
        self.sock.close()
