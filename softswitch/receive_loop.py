"""The receive loop: poll the ports, drain each ready one in bursts, run every frame through the pipeline.

One thread owns the receive buffers. It holds the switch lock for one burst at a time, so a P4Runtime
write lands between bursts, never inside a packet (the ``@atomic`` block of the P4 program is therefore
atomic here too), and a burst is short enough (``BURST`` or ``NATIVE_BURST`` packets) that writes are
not delayed. What a
burst sends leaves when the burst ends, a batch per port (``Port.flush`` or the native engine's
``flush``), outside the lock.

Two pipelines run the same loop: ``python`` (``Pipeline.process`` frame by frame, the ports' own
receive and send) and ``native`` (``softswitch.native``: one call per burst does the recvmmsg and every
frame in C, with the GIL held under the same lock; one more sends every port's queue).

With a capture (``softswitch.capture``, ``lhc-softswitch --pcap``), every frame a burst receives and
every frame it hands to a port is recorded, written when the burst ends; the native engine collects its
burst's frames only while a capture is set.

A datagram a port's socket refuses (EINVAL for an address it may not send to, a full buffer, ENXIO for
an interface gone: anything but the socket's own faults, ``lhc_ina.udp.is_fatal``) is lost alone and
counted in that port's ``send_errors`` and ``send_errors_by_errno`` (``port_counters``), on both
pipelines; every other frame of the burst still leaves. A socket error on a port (an OSError from a
receive, or from a flush whose socket is unusable) is counted and logged, and the loop goes on. If the
loop dies anyway, ``on_failure`` is called after a critical log line: the process must end rather than
keep a P4Runtime server answering for a switch that no longer forwards.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterable

from softswitch.capture import INBOUND, OUTBOUND, PcapngWriter
from softswitch.native import NativePipeline
from softswitch.pipeline import Pipeline
from softswitch.ports import Port

log = logging.getLogger(__name__)

#: Packets drained from one port per lock hold: amortizes poll() and the lock over many packets.
BURST = 64
#: The same for the native pipeline: a frame costs it a tenth of what it costs Python, so a burst four
#: times longer still holds the lock for less time, and gives each destination longer GSO runs.
NATIVE_BURST = 256
#: A port's socket errors are all counted, but logged at most once per this many seconds.
ERROR_LOG_INTERVAL = 1.0


class DataPlane:
    """Ports plus pipeline; ``start`` runs the loop in a thread, ``stop`` ends it.

    ``native``, when given, runs the bursts (it must be bound to ``pipeline``); ``on_failure`` is called
    with the exception if the loop dies; ``capture``, when given, records every frame in and out (the data
    plane closes it when it stops)."""

    def __init__(self, pipeline: Pipeline, ports: Iterable[Port], lock: threading.Lock, *,
                 on_failure: Callable[[BaseException], None], native: NativePipeline | None = None,
                 capture: PcapngWriter | None = None) -> None:
        self.pipeline = pipeline
        self.ports = {port.number: port for port in ports}
        self.lock = lock
        self.native = native
        self.on_failure = on_failure
        self.errors = 0  # frames that raised in the pipeline
        self.socket_errors = 0  # OSErrors from a port's receive or send
        self.failed: BaseException | None = None
        self._python_frames = {number: 0 for number in self.ports}
        self._native_errors = 0
        self._logged_at: dict[int, float] = {}
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._sending: set[Port] = set()  # python pipeline: ports that queued frames in this burst
        self.capture = capture
        self._captured: list[tuple[int, int, bytes]] = []  # this burst's frames, while capturing
        if native is not None:
            if native.pipeline is not pipeline:
                raise ValueError("the native pipeline must be bound to this data plane's Pipeline")
            for port in self.ports.values():
                native.attach(port)
            if capture is not None:
                native.set_capture(self._captured)

    @property
    def frames_in(self) -> int:
        """Frames received and run through the pipeline, on every port."""
        return sum(counters["frames_in"] for counters in self.port_counters().values())

    def port_counters(self) -> dict[int, dict]:
        """Per port, the same on both pipelines: ``frames_in``, ``dropped_non_udp`` (frames that could not
        leave a UDP port), ``send_errors`` (datagrams its socket refused) and ``send_errors_by_errno``
        (those per errno name, e.g. ``{"EINVAL": 3}``: whose destination lost them)."""
        if self.native is not None:
            return self.native.port_counters()
        return {number: {"frames_in": self._python_frames[number], "dropped_non_udp": port.dropped_non_udp,
                         "send_errors": port.send_errors, "send_errors_by_errno": port.send_errors_by_errno}
                for number, port in self.ports.items()}

    def emit(self, port: int, frame: memoryview) -> None:
        """Send a frame out of ``port``; a port with nothing attached drops it, as on BMv2."""
        target = self.ports.get(port)
        if target is not None:
            if target.send(frame) and self.capture is not None:
                self._captured.append((OUTBOUND, port, bytes(frame)))
            self._sending.add(target)

    def _write_captured(self, began_us: int) -> None:
        """This burst's frames into the capture file, stamped with the time the burst began."""
        assert self.capture is not None
        self.capture.record_all(self._captured, began_us)
        self.capture.flush()
        self._captured.clear()

    def _burst_python(self, port: Port) -> None:
        receive, number, process, emit = port.receive, port.number, self.pipeline.process, self.emit
        captured = self._captured if self.capture is not None else None
        began_us = time.time_ns() // 1000 if captured is not None else 0
        try:
            with self.lock:
                for _ in range(BURST):
                    length = receive()
                    if length < 0:
                        break
                    if length:
                        self._python_frames[number] += 1
                        if captured is not None:  # before process(), which rewrites the frame in place
                            captured.append((INBOUND, number, bytes(self.pipeline.rx[:length])))
                        try:
                            process(length, number, emit)
                        except Exception:  # a bug must cost one packet, not the switch
                            self.errors += 1
                            log.exception("port %d: a frame of %d bytes raised; dropped", number, length)
        finally:
            try:
                self._flush_ports()
            finally:
                if captured is not None:
                    self._write_captured(began_us)

    def _flush_ports(self) -> None:
        """Every port this burst sent on flushes, in the order the ports were given (the native engine's),
        even after one's socket raised; then the first such error is raised (dataplane_io.c's flush_all)."""
        sending, self._sending = [port for port in self.ports.values() if port in self._sending], set()
        first: OSError | None = None
        for port in sending:
            try:
                port.flush()
            except OSError as error:
                first = first or error
        if first is not None:
            raise first

    def _burst_native(self, port: Port) -> None:
        native = self.native
        assert native is not None
        began_us = time.time_ns() // 1000 if self.capture is not None else 0
        try:
            with self.lock:
                native.burst(port.number)
        finally:
            native.flush()
            if self.capture is not None:
                self._write_captured(began_us)
        if native.errors != self._native_errors:  # a broken table entry cost those frames
            self.errors += native.errors - self._native_errors
            self._native_errors = native.errors
            log.error("port %d: frames raised in the native pipeline and were dropped (%d in all); last: %r",
                      port.number, native.errors, native.last_error)

    def _socket_error(self, port: Port, error: OSError) -> None:
        """Count a port's socket error and log it (rate-limited per port); the loop goes on."""
        self.socket_errors += 1
        now = time.monotonic()
        if now - self._logged_at.get(port.number, -ERROR_LOG_INTERVAL) >= ERROR_LOG_INTERVAL:
            self._logged_at[port.number] = now
            log.warning("port %d: socket error (%d so far on all ports): %s", port.number, self.socket_errors,
                        error)

    def run(self) -> None:
        poller = select.poll()
        by_fd = {}
        for port in self.ports.values():
            poller.register(port.fileno(), select.POLLIN)
            by_fd[port.fileno()] = port
        poller.register(self._wake_r, select.POLLIN)
        burst = self._burst_python if self.native is None else self._burst_native
        while not self._stopping:
            for fd, _ in poller.poll():
                port = by_fd.get(fd)
                if port is None:
                    continue  # the wake-up pipe: the loop condition decides
                try:
                    burst(port)
                except OSError as error:
                    self._socket_error(port, error)

    def _run_logged(self) -> None:
        try:
            self.run()
        except BaseException as error:  # the switch must say why it stopped forwarding, never stop silently
            self.failed = error
            log.critical("the data plane thread died, the switch no longer forwards: the process exits",
                         exc_info=True)
            self.on_failure(error)

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
        if self.capture is not None:
            self.capture.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
