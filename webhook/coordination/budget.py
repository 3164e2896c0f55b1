"""The time one coordinated decision may take (see ``Budget``)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Budget:
    """How long one decision may take, how long it may wait for its siblings, and how long one
    API call may take.

    The whole decision ends by ``until``, below the webhook's timeout: an answer after it would
    be the API server's ``failurePolicy`` (an allocation or bind unchecked), so past it the
    decision is ``Busy`` and denied, never late. Waiting for a sibling decision on the same key
    (the table's lock, a Lease another writer just replaced) ends by ``wait_until``, also
    ``Busy``. An API call gets ``call_seconds`` (what is left of the budget, if less): only an
    API server slower than ``call_seconds`` is an outage and fails open.
    """

    wait_until: float  # time.monotonic()
    call_seconds: float
    until: float = math.inf  # time.monotonic()

    @classmethod
    def start(cls, wait_seconds: float, call_seconds: float, total_seconds: float = math.inf) -> Budget:
        now = time.monotonic()
        until = now + total_seconds
        return cls(min(now + wait_seconds, until), call_seconds, until)

    @classmethod
    def of(cls, settings: Any) -> Budget:
        """A decision's budget from ``policies.nodeAdmission.reservations``."""
        return cls.start(settings.wait_seconds, settings.deadline_seconds, settings.budget_seconds)

    def waiting(self) -> float:
        return max(0.0, self.wait_until - time.monotonic())

    def left(self) -> float:
        return self.until - time.monotonic()

    def call_timeout(self, what: str) -> float:
        """The timeout of the next API call; ``Busy`` when the decision's budget is spent."""
        left = self.left()
        if left <= 0:
            raise Busy(f"the decision's time budget ran out before {what}")
        return min(self.call_seconds, left)


class Busy(Exception):
    """Sibling decisions on the same node held it past the wait budget, or the decision's time
    budget ran out: retry later."""


class DeadlineExceeded(Exception):
    """The API server took longer than the deadline to answer one coordination call."""
