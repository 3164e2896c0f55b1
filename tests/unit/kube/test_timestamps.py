"""One reading of Kubernetes times (``metav1.Time``): parsed and formatted in one module."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from webhook.kube.timestamps import format_rfc3339, object_time, rfc3339_seconds


@given(st.integers(0, 4_102_444_800))
def test_an_object_time_reads_back_what_the_api_server_writes(epoch):
    assert object_time(format_rfc3339(epoch)) == epoch


def test_an_object_time_without_an_offset_is_utc_never_the_readers_local_time(monkeypatch):
    import time

    monkeypatch.setenv("TZ", "America/Los_Angeles")
    time.tzset()
    try:
        assert object_time("2026-01-01T00:00:00") == object_time("2026-01-01T00:00:00Z") == 1767225600
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_an_unreadable_or_missing_object_time_is_none():
    for value in (None, "", "yesterday", 17, "2026-13-01T00:00:00Z"):
        assert object_time(value) is None


def test_a_moment_asked_for_must_name_an_instant():
    assert rfc3339_seconds("2026-01-01T00:00:00Z") == 1767225600
    for vague in ("2026-01-01", "2026-01-01T00:00:00", "2026-01-01T00:00Z"):
        try:
            rfc3339_seconds(vague)
        except ValueError:
            continue
        raise AssertionError(f"{vague!r} was accepted")
