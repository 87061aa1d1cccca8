"""The receive loop: poll the ports, drain each ready one in bursts, run every frame through the pipeline.

One thread owns the pipeline's receive buffer. It holds the switch lock for one burst at a time, so a
P4Runtime write lands between bursts, never inside a packet (the ``@atomic`` block of the P4 program is
therefore atomic here too), and a burst is short enough (``BURST`` packets) that writes are not delayed.
What a burst sends leaves when the burst ends, a batch per port (``Port.flush``), outside the lock.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Iterable

from softswitch.pipeline import Pipeline
from softswitch.ports import Port

log = logging.getLogger(__name__)

#: Packets drained from one port per lock hold: amortizes poll() and the lock over many packets.
BURST = 64


class DataPlane:
    """Ports plus pipeline; ``start`` runs the loop in a thread, ``stop`` ends it."""

    def __init__(self, pipeline: Pipeline, ports: Iterable[Port], lock: threading.Lock) -> None:
        self.pipeline = pipeline
        self.ports = {port.number: port for port in ports}
        self.lock = lock
        self.frames_in = 0
        self.errors = 0
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._sending: set[Port] = set()  # ports that queued frames in this burst

    def emit(self, port: int, frame: memoryview) -> None:
        """Send a frame out of ``port``; a port with nothing attached drops it, as on BMv2."""
        target = self.ports.get(port)
        if target is not None:
            target.send(frame)
            self._sending.add(target)

    def run(self) -> None:
        poller = select.poll()
        by_fd = {}
        for port in self.ports.values():
            poller.register(port.fileno(), select.POLLIN)
            by_fd[port.fileno()] = port
        poller.register(self._wake_r, select.POLLIN)
        process, emit, lock = self.pipeline.process, self.emit, self.lock
        while not self._stopping:
            for fd, _ in poller.poll():
                port = by_fd.get(fd)
                if port is None:
                    continue  # the wake-up pipe: the loop condition decides
                receive, number = port.receive, port.number
                with lock:
                    for _ in range(BURST):
                        length = receive()
                        if length < 0:
                            break
                        if length:
                            self.frames_in += 1
                            try:
                                process(length, number, emit)
                            except Exception:  # a bug must cost one packet, not the switch
                                self.errors += 1
                                log.exception("port %d: a frame of %d bytes raised; dropped", number, length)
                for sending in self._sending:
                    sending.flush()
                self._sending.clear()

    def _run_logged(self) -> None:
        try:
            self.run()
        except Exception:  # the switch must say why it stopped forwarding, never stop silently
            log.exception("data plane stopped")
            raise

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run_logged, name="softswitch-dataplane", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the loop, wait for it and close the ports."""
        self._stopping = True
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        for port in self.ports.values():
            port.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
