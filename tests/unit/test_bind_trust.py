"""What the bind guard promises when callers lie and stores fail: forged reviews hold capacity
for seconds, a broken table does not switch coordination off, and no name or file the guard
derives can make it fail open or crash."""

from __future__ import annotations

import errno
import multiprocessing
import os
import re
import subprocess
import time

import pytest

from tests.helpers.binds import binding, gpu_pod, pod_create, reserve, review_of, state_with
from tests.helpers.builders import node, pod
from webhook.binding import BindGuard
from webhook.config import config_from_dict
from webhook.coordination.names import MAX_FILE_NAME, MAX_OBJECT_NAME, table_file_name
from webhook.coordination.reservations import Reservation, kept, lease_name, node_table
from webhook.serve.app import create_app
from webhook.state.source import FixedState

CONFIRM = {"policies": {"nodeAdmission": {"reservations": {"confirmSeconds": 2}}}}


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def guard_with(tmp_path, config: dict, **kwargs) -> BindGuard:
    return BindGuard(config_from_dict(config), node_table(tmp_path / "table"), **kwargs)


# -- forged reviews: without an authenticated caller, a reservation must be confirmed -----------


def test_a_forged_bind_holds_the_last_gpu_only_until_its_confirmation_time(tmp_path):
    clock = Clock()
    guard = guard_with(tmp_path, CONFIRM, clock=clock)
    state = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("victim"), gpu_pod("real"))
    source = FixedState(state)
    assert guard.review(review_of(binding("victim", "gpu-1")), source).allowed  # forged: never bound
    clock.now += 1
    held = guard.review(review_of(binding("real", "gpu-1")), source)
    assert not held.allowed and held.reasons == ["OutOfnvidia.com/gpu"]
    clock.now += 1.5  # past confirmSeconds, and the state never showed victim on gpu-1
    assert guard.review(review_of(binding("real", "gpu-1")), source).allowed


def test_a_verified_callers_bind_holds_its_reservation_for_the_whole_ttl(tmp_path):
    clock = Clock()
    guard = guard_with(tmp_path, CONFIRM, clock=clock)
    state = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("first"), gpu_pod("second"))
    source = FixedState(state)
    assert guard.review(review_of(binding("first", "gpu-1")), source, verified=True).allowed
    clock.now += 10  # past confirmSeconds, within the 30 s TTL: the watch may lag that long
    late = guard.review(review_of(binding("second", "gpu-1")), source, verified=True)
    assert not late.allowed and late.reasons == ["OutOfnvidia.com/gpu"]


def test_forged_pods_created_with_node_name_free_an_empty_node_within_seconds(tmp_path):
    clock = Clock()
    guard = guard_with(tmp_path, CONFIRM, clock=clock)
    state = state_with(node("small", pods="10"), pod("pending", namespace="ml", uid="uid-pending"))
    client = create_app(config_from_dict(CONFIRM), FixedState(state), bind_guard=guard).test_client()
    for i in range(10):  # reviews only: the API server never created these pods
        forged = pod(f"forged-{i}", namespace="ml", node_name="small", uid=f"uid-forged-{i}")
        assert client.post("/validate", json=pod_create(forged)).get_json()["response"]["allowed"]
    source = FixedState(state)
    full = guard.review(review_of(binding("pending", "small", uid="uid-pending")), source)
    assert not full.allowed and full.reasons == ["OutOfpods"]
    clock.now += 3
    assert guard.review(review_of(binding("pending", "small", uid="uid-pending")), source).allowed


def test_a_reservation_the_state_confirms_is_kept_past_its_confirmation_time():
    state = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("a", node_name="gpu-1"))
    confirmed = Reservation("uid-a", "gpu-1", {"nvidia.com/gpu": 1}, (), expires=100.0, confirm_by=10.0)
    elsewhere = Reservation("uid-a", "gpu-2", {"nvidia.com/gpu": 1}, (), expires=100.0, confirm_by=10.0)
    assert kept(confirmed, state, now=50.0)  # replicas whose watch lags still count it
    assert not kept(elsewhere, state, now=50.0)  # bound to another node: the review was forged


def test_a_binding_namespace_comes_from_the_request_not_from_the_object(tmp_path):
    # A Binding whose object claims an excluded namespace must not skip the check.
    state = state_with(
        node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("running", node_name="gpu-1"), gpu_pod("late")
    )
    review = binding("late", "gpu-1")
    review["request"]["object"]["metadata"]["namespace"] = "kube-system"
    outcome = guard_with(tmp_path, {}).review(review_of(review), FixedState(state))
    assert not outcome.allowed and outcome.reasons == ["OutOfnvidia.com/gpu"]


# -- a failing or damaged table ---------------------------------------------------------------


def _unwritable_table(monkeypatch) -> None:
    from webhook.coordination import table as reservations

    def read_only(self, path, codec):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(reservations._TableFile, "__init__", read_only)


def test_a_read_only_table_still_coordinates_device_binds_through_the_lease(tmp_path, leases, monkeypatch):
    _, store = leases
    _unwritable_table(monkeypatch)
    state = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("a"), gpu_pod("b"))
    conf = config_from_dict({})
    guard = BindGuard(conf, node_table(tmp_path / "t"), store)
    client = create_app(conf, FixedState(state), bind_guard=guard).test_client()
    first = client.post("/validate", json=binding("a", "gpu-1")).get_json()["response"]
    assert first["allowed"] is True and "warnings" not in first
    second = client.post("/validate", json=binding("b", "gpu-1")).get_json()["response"]
    assert second["allowed"] is False and second["status"]["reason"] == "OutOfnvidia.com/gpu"
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'admit_guard_reservation_table_trouble_total{reason="table-error"} 2.0' in metrics
    assert "admit_guard_binding_fail_open_total{" not in metrics.replace("# HELP", "").replace("# TYPE", "")


def test_a_read_only_table_allows_an_uncoordinated_bind_unchecked_as_table_error(tmp_path, monkeypatch):
    _unwritable_table(monkeypatch)
    state = state_with(node("n1"), pod("a", namespace="ml", requests={"cpu": "1"}))
    conf = config_from_dict({})
    guard = BindGuard(conf, node_table(tmp_path / "t"))
    client = create_app(conf, FixedState(state), bind_guard=guard).test_client()
    response = client.post("/validate", json=binding("a", "n1")).get_json()["response"]
    assert response["allowed"] is True and "reservation table failed" in response["warnings"][0]
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'admit_guard_binding_fail_open_total{reason="table-error"} 1.0' in metrics


def test_a_damaged_table_is_rebuilt_from_the_lease_and_counted(tmp_path, leases):
    _, store = leases
    state = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("a"), gpu_pod("b"))
    conf = config_from_dict({})
    guard = BindGuard(conf, node_table(tmp_path / "t"), store)
    client = create_app(conf, FixedState(state), bind_guard=guard).test_client()
    assert client.post("/validate", json=binding("a", "gpu-1")).get_json()["response"]["allowed"]
    (tmp_path / "t" / "gpu-1.table").write_bytes(b"\x07" * 64)  # garbage header and entries
    second = client.post("/validate", json=binding("b", "gpu-1")).get_json()["response"]
    assert second["allowed"] is False and second["status"]["reason"] == "OutOfnvidia.com/gpu"
    assert [r.pod for r in node_table(tmp_path / "t").entries("gpu-1", time.monotonic() + 1)] == ["uid-a"]
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'admit_guard_reservation_table_trouble_total{reason="table-damaged"} 1.0' in metrics


def _reserve_after_truncation(directory: str) -> None:
    table = node_table(directory)
    for n in range(60):  # past the first page: the mapping is 8 KiB
        new = Reservation(f"uid-{n:03}", "node-1", {"cpu": 1}, (("TCP", "", 8000 + n),), time.time() + 30)
        reserve(table, new, lambda stored: True, lambda r: True, deadline=time.monotonic() + 1)
    os.truncate(os.path.join(directory, "node-1.table"), 0)  # by anything but the guard
    late = Reservation("uid-late", "node-1", {"cpu": 1}, (), time.time() + 30)
    assert reserve(table, late, lambda stored: stored == [], lambda r: True, deadline=time.monotonic() + 1)
    os._exit(0)


def test_a_table_file_truncated_while_mapped_is_read_as_damaged_never_sigbus(tmp_path):
    child = multiprocessing.get_context("fork").Process(
        target=_reserve_after_truncation, args=(str(tmp_path / "t"),)
    )
    child.start()
    child.join(30)
    assert child.exitcode == 0, f"the worker died: exit code {child.exitcode} (-7 is SIGBUS)"


def _reserve_on_a_full_disk(directory: str, filler: str) -> None:
    table = node_table(directory)
    first = Reservation("uid-a", "node-1", {"cpu": 1}, (), time.time() + 30)
    reserve(table, first, lambda stored: True, lambda r: True, deadline=time.monotonic() + 1)
    fill = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:  # the rest of the filesystem
        while True:
            os.write(fill, b"\0" * 4096)
    except OSError:
        os.close(fill)
    many = {f"example.com/r{i}": 1 for i in range(1000)}  # the file must grow past its page
    try:
        reserve(
            table,
            Reservation("uid-b", "node-1", many, (), time.time() + 30),
            bool,
            bool,
            deadline=time.monotonic() + 5,
        )
    except OSError as err:
        os._exit(0 if err.errno == errno.ENOSPC else 3)
    os._exit(4)


@pytest.fixture
def small_tmpfs(tmp_path):
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_filesystem_fails_the_table_with_enospc_never_sigbus(small_tmpfs):
    child = multiprocessing.get_context("fork").Process(
        target=_reserve_on_a_full_disk, args=(str(small_tmpfs / "t"), str(small_tmpfs / "filler"))
    )
    child.start()
    child.join(30)
    assert child.exitcode == 0, f"exit code {child.exitcode} (-7 is SIGBUS, 3 another error, 4 no error)"


# -- names that always fit ------------------------------------------------------------------

_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _longest_node_names() -> list[str]:
    label = "a" * 62 + "b"
    dotted = ".".join([label, label, label, "c" * 61])  # 253 characters, a legal node name
    hyphen_at_cut = ("x" * 200 + "-" + "y" * 52)[:253]
    return [dotted, hyphen_at_cut, "n" * 253, dotted[:-1] + "d"]


@pytest.mark.parametrize("name", _longest_node_names())
def test_the_longest_legal_node_names_give_lease_and_file_names_that_fit(name):
    assert len(name) == 253
    lease = lease_name(name)
    assert len(lease) <= MAX_OBJECT_NAME and _SUBDOMAIN.fullmatch(lease), lease
    file_name = table_file_name(name)
    assert len(file_name.encode()) <= MAX_FILE_NAME and "/" not in file_name
    assert lease.startswith("admit-guard-node-" + name[:100])  # readable


def test_long_node_names_that_share_a_prefix_get_different_names():
    first, second = _longest_node_names()[0], _longest_node_names()[3]
    assert lease_name(first) != lease_name(second)
    assert table_file_name(first) != table_file_name(second)


def test_short_node_names_keep_their_plain_lease_and_file_names():
    assert lease_name("gpu-1") == "admit-guard-node-gpu-1"
    assert table_file_name("gpu-1") == "gpu-1.table"


def test_a_bind_to_a_node_with_the_longest_legal_name_is_checked_and_coordinated(tmp_path, leases):
    cluster, store = leases
    name = _longest_node_names()[0]
    state = state_with(node(name, extra={"nvidia.com/gpu": "1"}), gpu_pod("a"), gpu_pod("b"))
    guard = BindGuard(config_from_dict({}), node_table(tmp_path / "t"), store)
    first = guard.review(review_of(binding("a", name)), FixedState(state))
    assert first.allowed and first.fail_open is None and not first.response.get("warnings")
    second = guard.review(review_of(binding("b", name)), FixedState(state))
    assert not second.allowed and second.reasons == ["OutOfnvidia.com/gpu"]
    assert [key[1] for key in cluster.leases] == [lease_name(name)]
