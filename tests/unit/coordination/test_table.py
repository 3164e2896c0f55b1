"""A node's table is held from ``LocalTable.hold`` to ``HeldTable.release``, and every path out of
a decision releases it: a read that fails, a judge that raises, a transaction over two keys."""

from __future__ import annotations

import threading
import time

import pytest

from webhook.binding import RESERVATION_RECORDS
from webhook.coordination import table as table_module
from webhook.coordination.budget import Budget, Busy
from webhook.coordination.reservations import Reservation, node_table
from webhook.coordination.transaction import Transaction


def _soon(seconds: float = 0.2) -> float:
    return time.monotonic() + seconds


def _held_elsewhere(table, node: str) -> bool:
    """Whether another thread (as another decision would) waits past a short deadline for ``node``."""
    result: list[bool] = []

    def attempt() -> None:
        try:
            table.hold(node, _soon(0.05)).release()
            result.append(False)
        except Busy:
            result.append(True)

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join(5)
    return result == [True]


def test_a_held_node_waits_other_decisions_out_until_it_is_released(tmp_path):
    table = node_table(tmp_path)
    held = table.hold("node-1", _soon())
    assert _held_elsewhere(table, "node-1")
    assert not _held_elsewhere(table, "node-2")  # one node's hold is not another's
    held.release()
    assert not _held_elsewhere(table, "node-1")


def test_a_table_that_cannot_be_read_is_released_for_the_next_decision(tmp_path, monkeypatch):
    table = node_table(tmp_path)
    table.hold("node-1", _soon()).release()  # the file exists and stays open
    real_read = table_module._TableFile.read

    def failing(self):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(table_module._TableFile, "read", failing)
    with pytest.raises(OSError):
        table.hold("node-1", _soon())
    monkeypatch.setattr(table_module._TableFile, "read", real_read)
    assert not _held_elsewhere(table, "node-1")


def test_a_transaction_whose_judge_raises_releases_every_table_it_held(tmp_path):
    table = node_table(tmp_path)
    budget = Budget.start(1.0, 1.0)
    transaction = Transaction(RESERVATION_RECORDS, table, None, budget, lambda: budget)
    new = Reservation("uid-a", "node-1", {"cpu": 1}, (), time.time() + 30)

    def judge(seen) -> bool:
        assert _held_elsewhere(table, "node-1") and _held_elsewhere(table, "node-2")
        raise RuntimeError("a bug in a judge")

    with pytest.raises(RuntimeError):
        transaction.run(["node-1", "node-2"], new, judge, lambda r: True, coordinated=False, write=True)
    assert not _held_elsewhere(table, "node-1")
    assert not _held_elsewhere(table, "node-2")


def test_a_decision_that_fits_is_written_and_the_tables_released(tmp_path):
    table = node_table(tmp_path)
    budget = Budget.start(1.0, 1.0)
    transaction = Transaction(RESERVATION_RECORDS, table, None, budget, lambda: budget)
    new = Reservation("uid-a", "node-1", {"cpu": 1}, (), time.time() + 30)
    assert transaction.run(["node-1"], new, lambda seen: True, lambda r: True, coordinated=False, write=True)
    assert [r.pod for r in table.entries("node-1", _soon())] == ["uid-a"]
    assert not _held_elsewhere(table, "node-1")
