"""The cyclic garbage collector paused while a bulk of acyclic objects is built.

A list page, a snapshot or a watch backlog is thousands of new dicts and records with no
cycles: the collector's passes over them (and, once they are promoted, over the whole state)
cost as much as the parse itself at 150,000 pods, and free nothing.

A list builds the state a page at a time, and each page's records live as long as the state:
``freeze_survivors`` takes them out of the collector's reach for good. Without it the full
collections between pages scanned the growing state again and again: 5-7 s of a 35-42 s list
of 1.3 M pods (``bench/replica_memory_bench.py``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a bulk build of acyclic objects."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def freeze_survivors() -> None:
    """Freeze what the collector tracks (the records a list page just built): no later
    collection scans it, in this process or in a worker forked from it. Frozen objects are
    still freed when nothing refers to them; a cycle is not, if it is alive now and dies later,
    or died since the last collection: garbage of that kind is rare in an informer, and a
    collection of the young generation before each freeze cost more (0.7 ms a page) than
    the passes it saves."""
    gc.freeze()
