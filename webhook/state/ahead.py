"""A call that runs on a thread of its own while its caller goes on: the next page of a list,
requested while this one is applied."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Ahead:
    """A call run on a thread of its own from now on; ``result`` waits for it (or raises what
    it raised). A daemon thread, not ``concurrent.futures``' (whose threads the interpreter
    joins at exit): a list abandoned part way leaves its request to end on its own."""

    def __init__(self, call: Callable[..., Any], *args: Any) -> None:
        self._outcome: tuple[bool, Any] = (False, None)

        def run() -> None:
            try:
                self._outcome = (True, call(*args))
            except BaseException as err:  # handed to the caller of ``result``
                self._outcome = (False, err)

        self._thread = threading.Thread(target=run, name="informer-page-ahead", daemon=True)
        self._thread.start()

    def result(self) -> Any:
        self._thread.join()
        done, value = self._outcome
        if not done:
            raise value
        return value
