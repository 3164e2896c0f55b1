"""Every component of the box is a loop on its own thread: one step per tick, until stopped.
A step that raises stops its loop and the error is raised again at ``stop``, so a broken
component fails the scenario instead of going quiet."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Loop:
    def __init__(self, name: str, step: Callable[[], None], tick: float = 0.01) -> None:
        self.name, self.step, self.tick = name, step, tick
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Loop:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except BaseException as err:
                self.error = err
                return
            self._stop.wait(self.tick)

    def stop(self) -> None:
        """Stop (again: a no-op) and raise what stopped the loop, if anything did."""
        self._stop.set()
        self._thread.join(timeout=30)
        if self.error is not None:
            raise RuntimeError(f"{self.name} failed") from self.error
