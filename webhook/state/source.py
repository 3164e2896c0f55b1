"""Where the server's cluster state comes from: a fixed snapshot, or (later) a live informer.

The server only needs three things from a source: the state to judge against (read under
whatever lock keeps it consistent), whether it is ready, and how fresh it is.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from .model import ClusterState


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    reason: str
    nodes: int = 0
    pods: int = 0
    updated_at: float | None = None  # wall clock of the last applied change (or bookmark)
    relists: int = 0


@dataclass(frozen=True, slots=True)
class StateView:
    """The state to judge against, or None with the reason it cannot be trusted right now."""

    state: ClusterState | None
    unavailable: str | None = None


class StateSource(Protocol):
    def reading(self) -> AbstractContextManager[StateView]:
        """The state, consistent for the duration of the ``with`` block."""

    def readiness(self) -> Readiness: ...

    def close(self) -> None:
        """Stop background work (watches); called when a worker exits."""


@dataclass(slots=True)
class FixedState:
    """A snapshot loaded once at start (or no state at all): always ready, never changes."""

    state: ClusterState | None
    loaded_at: float = field(default_factory=time.time)

    @contextmanager
    def reading(self) -> Iterator[StateView]:
        yield StateView(self.state)

    def close(self) -> None:
        pass

    def readiness(self) -> Readiness:
        if self.state is None:
            return Readiness(
                True, "no cluster state configured: node checks only warn", updated_at=self.loaded_at
            )
        return Readiness(
            True,
            "snapshot loaded",
            nodes=len(self.state.nodes),
            pods=len(self.state.pods),
            updated_at=self.loaded_at,
        )
