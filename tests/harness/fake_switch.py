"""A UDP socket on loopback that plays the switch for one stream's tests: a thread hands every datagram it
receives to ``answer`` (a subclass's), until ``close``."""

from __future__ import annotations

import socket
import threading


class FakeSwitch:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> FakeSwitch:
        self._thread.start()
        return self

    def answer(self, data: bytes, worker: tuple[str, int]) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data, worker = self.sock.recvfrom(2048)
            except TimeoutError:
                continue
            self.answer(data, worker)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sock.close()
