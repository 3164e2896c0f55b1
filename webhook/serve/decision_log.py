"""Decision log lines written by a thread of their own, so a request never waits on stderr.

A synchronous ``StreamHandler`` writes under the logging lock on every request: profiled under
load it was a tenth of the workers' CPU, and a slow log pipeline would stall decisions. The
request thread only appends the line to a queue; one writer thread per process drains the queue
in batches, lingering a moment after the first line so that a busy worker wakes it and writes
once per batch, not once per request. ``flush`` (called when a gunicorn worker exits, and at
interpreter exit) writes what is queued before the process ends, so a graceful shutdown loses
no line.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import TextIO

_STOP = object()
LINGER = 0.02  # seconds the writer waits after a first line for more to join its batch


class BackgroundLines(logging.Handler):
    """A logging handler that hands each formatted line to a writer thread."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream
        # Each writer has its own queue and wake-up event, swapped together under the lock, so a
        # flush stops exactly the writer it found and a new one never takes the old one's stop.
        self._lines: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._writer: threading.Thread | None = None
        self._pid = 0
        self._start_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # a broken record must not fail the request
            self.handleError(record)
            return
        self.line(line)

    def handle(self, record: logging.LogRecord) -> bool:
        """``emit`` without the handler's lock: the queue is the only thing shared."""
        if self.filter(record):
            self.emit(record)
            return True
        return False

    def line(self, text: str) -> None:
        """Queue one line, already formatted."""
        self._ensure_writer()
        self._lines.put(text)

    def flush(self) -> None:
        """Write every queued line and stop the writer; a later line starts a new one."""
        with self._start_lock:
            writer, lines, wake = self._writer, self._lines, self._wake
            self._writer, self._lines, self._wake = None, queue.SimpleQueue(), threading.Event()
        if self._pid not in (0, os.getpid()):
            return  # lines queued before a fork are the parent's to write
        if writer is not None:
            lines.put(_STOP)
            wake.set()  # cut the linger short
            writer.join(timeout=5)
        self._write_pending(lines)

    def _ensure_writer(self) -> None:
        # Threads do not survive a fork: each gunicorn worker starts its own writer.
        if self._writer is not None and self._pid == os.getpid():
            return
        with self._start_lock:
            if self._writer is None or self._pid != os.getpid():
                if self._pid not in (0, os.getpid()):
                    # The parent's lines are the parent's to write.
                    self._lines, self._wake = queue.SimpleQueue(), threading.Event()
                self._pid = os.getpid()
                self._writer = threading.Thread(
                    target=self._drain, args=(self._lines, self._wake), name="decision-log", daemon=True
                )
                self._writer.start()

    def _drain(self, lines: queue.SimpleQueue, wake: threading.Event) -> None:
        while True:
            line = lines.get()
            if line is _STOP:
                return
            wake.wait(LINGER)
            batch = [line]
            while len(batch) < 4096:
                try:
                    line = lines.get_nowait()
                except queue.Empty:
                    break
                if line is _STOP:
                    self._write(batch)
                    return
                batch.append(line)
            self._write(batch)

    def _write_pending(self, lines: queue.SimpleQueue) -> None:
        batch = []
        while True:
            try:
                line = lines.get_nowait()
            except queue.Empty:
                break
            if line is not _STOP:
                batch.append(line)
        self._write(batch)

    def _write(self, batch: list[str]) -> None:
        if not batch:
            return
        try:
            self.stream.write("\n".join(batch) + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # the log pipe is gone; decisions must go on
            pass


def log_lines_in_background(
    logger: logging.Logger, stream: TextIO, fmt: str = "%(message)s"
) -> BackgroundLines:
    """Send ``logger``'s lines (bare messages, unless ``fmt`` says more) to ``stream`` through a
    writer thread; once: a second call returns the handler of the first."""
    for handler in logger.handlers:
        if isinstance(handler, BackgroundLines):
            return handler
    handler = BackgroundLines(stream)
    handler.setFormatter(logging.Formatter(fmt))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    atexit.register(handler.flush)
    return handler


def line_writer(logger: logging.Logger) -> Callable[[str], None]:
    """How to log a finished line on ``logger`` at INFO, as cheaply as its set-up allows.

    When its one handler is a ``BackgroundLines`` and nothing propagates (what
    ``log_lines_in_background`` sets up), the line goes straight to that handler's queue: no
    ``LogRecord`` is built, a sixth of a decision's own time. Otherwise through ``logging``
    (tests capture it there). Chosen once, when the app is built.
    """
    handlers = logger.handlers
    if (
        len(handlers) == 1
        and isinstance(handlers[0], BackgroundLines)
        and not logger.propagate
        and logger.isEnabledFor(logging.INFO)
        and not logger.filters
    ):
        return handlers[0].line
    return logger.info


def flush_decision_lines(logger: logging.Logger) -> None:
    """Write out what the logger's background handlers still hold (a worker is exiting)."""
    for handler in logger.handlers:
        if isinstance(handler, BackgroundLines):
            handler.flush()
