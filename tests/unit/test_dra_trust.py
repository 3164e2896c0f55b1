"""Trust III: no device handed out twice under the writers' real order, slow Leases and hostile
claims. Each test reproduces a failure an adversarial run found in the DRA allocation guard."""

from __future__ import annotations

import copy
import time

import orjson
import pytest

from tests.helpers.app import answer
from tests.helpers.claims import one_gpu_left, state_with, status_update
from tests.helpers.dra_builders import claim, gpus, resource_slice, result
from webhook.allocation import AllocationGuard
from webhook.config import config_from_dict
from webhook.coordination.allocations import ANNOTATION, POOL_LEASE_PREFIX, pool_leases, pool_table
from webhook.coordination.budget import Budget
from webhook.coordination.lease import LeaseStore, collect_ended
from webhook.coordination.names import bounded_name
from webhook.coordination.reservations import node_table
from webhook.serve.app import create_app
from webhook.state.source import FixedState

POOL_LEASE = bounded_name(POOL_LEASE_PREFIX, "gpu.example.com/node-1", 253)


def claim_at(name: str, version: str, **kwargs) -> dict:
    """A claim as the watch shows it, at ``version``."""
    obj = claim(name, namespace="ml", **kwargs)
    obj["metadata"]["resourceVersion"] = version
    return obj


def guard_client(state, tmp_path, config: dict | None = None, leases=None, **kwargs):
    conf = config_from_dict(config or {})
    if leases is not None:
        table, stores = pool_table(tmp_path / "t"), pool_leases(leases.api, "admit-guard")
    else:
        table, stores = pool_table(tmp_path / "allocations"), None
    guard = AllocationGuard(conf, table, stores, **kwargs)
    return create_app(conf, FixedState(state), allocation_guard=guard).test_client()


def wants(name: str, *devices: str, pool: str = "node-1", version: str = "41", **kwargs) -> dict:
    """kube-scheduler's status write allocating ``devices`` to ml/``name``."""
    results = [result(d, pool=pool) for d in devices]
    return status_update(claim(name, namespace="ml", results=results), version=version, **kwargs)


# -- 1. the writer's real order ------------------------------------------------------------------


def test_an_allocation_in_flight_counts_while_the_watch_has_not_shown_the_finalizer_update(tmp_path):
    """kube-scheduler's bindClaim adds the delete-protection finalizer (an Update: version 41),
    then writes the allocation over 41. The state still shows the claim at 40: older than the
    record, not evidence that the write was overtaken."""
    state = one_gpu_left()
    state.devices.set_claim(claim_at("a", "40"))
    client = guard_client(state, tmp_path)
    assert answer(client, wants("a", "gpu-1", version="41"))["allowed"]
    second = answer(client, wants("b", "gpu-1"))
    assert second["allowed"] is False and second["status"]["reason"] == "DeviceAlreadyAllocated"
    assert "ml/a" in second["status"]["message"]


def test_an_allocation_in_flight_ends_when_the_state_shows_its_claim_deallocated_after_it_landed(tmp_path):
    state = one_gpu_left()
    state.devices.set_claim(claim_at("a", "40"))
    client = guard_client(state, tmp_path)
    assert answer(client, wants("a", "gpu-1", version="41"))["allowed"]
    state.devices.set_claim(claim_at("a", "42", results=[result("gpu-1")]))  # landed
    assert not answer(client, wants("b", "gpu-1"))["allowed"]
    state.devices.set_claim(claim_at("a", "43"))  # deallocated after that
    assert answer(client, wants("b", "gpu-1"))["allowed"]


def test_an_allocation_in_flight_ends_when_the_state_shows_its_claim_deleted(tmp_path):
    state = one_gpu_left()
    state.devices.set_claim(claim_at("a", "40"))
    client = guard_client(state, tmp_path)
    assert answer(client, wants("a", "gpu-1", version="41"))["allowed"]
    state.devices.delete_claim(claim_at("a", "44"))
    assert answer(client, wants("b", "gpu-1"))["allowed"]


def test_an_allocation_in_flight_whose_claim_changed_unallocated_after_its_version_is_overtaken(tmp_path):
    """The write replaced version 41; the state shows 42 without an allocation: the write lost
    a conflict (the API server's precondition) or was undone, so it no longer holds the GPU."""
    state = one_gpu_left()
    state.devices.set_claim(claim_at("a", "40"))
    client = guard_client(state, tmp_path)
    assert answer(client, wants("a", "gpu-1", version="41"))["allowed"]
    state.devices.set_claim(claim_at("a", "42"))
    assert answer(client, wants("b", "gpu-1"))["allowed"]


def test_a_reservation_counts_while_the_watch_has_not_shown_the_pods_update_before_its_binding(tmp_path):
    """The bind guard's records end on the pod bound, ended or expired, never on its version:
    a label or finalizer Update just before the Binding changes nothing."""
    from tests.helpers.binds import binding, gpu_pod, review_of
    from tests.helpers.binds import state_with as pods_state
    from tests.helpers.builders import node
    from webhook.binding import BindGuard
    from webhook.state import pod_record

    a, b = gpu_pod("a"), gpu_pod("b")
    state = pods_state(node("gpu-1", extra={"nvidia.com/gpu": "1"}), a, b)
    guard = BindGuard(config_from_dict({}), node_table(tmp_path / "t"))
    assert guard.review(review_of(binding("a", "gpu-1")), FixedState(state)).allowed
    touched = copy.deepcopy(a)
    touched["metadata"]["labels"] = {"touched": "yes"}
    touched["metadata"]["resourceVersion"] = "99"
    state.set_pod(touched["metadata"]["uid"], pod_record(touched))  # still pending, a newer version
    second = guard.review(review_of(binding("b", "gpu-1")), FixedState(state))
    assert not second.allowed and second.reasons == ["OutOfnvidia.com/gpu"]


# -- 3. nothing left behind by a denial ------------------------------------------------------------


def three_pools() -> object:
    slices = [
        resource_slice(f"node-{i}-gpus", pool=f"node-{i}", node_name=f"node-{i}", devices=gpus("gpu-0"))
        for i in (1, 2, 3)
    ]
    return state_with(slices=slices, nodes=("node-1", "node-2", "node-3"))


def multi_pool(name: str, *pools: str) -> dict:
    results = [result("gpu-0", pool=p) for p in pools]
    return status_update(claim(name, namespace="ml", results=results, node=None))


def test_a_multi_pool_allocation_denied_at_its_last_pool_leaves_no_record_in_the_others(tmp_path, leases):
    cluster, store = leases
    state = three_pools()
    other_replica = guard_client(state, tmp_path / "other", leases=store)
    assert answer(other_replica, multi_pool("holder", "node-3"))["allowed"]
    client = guard_client(state, tmp_path / "this", leases=store)
    denied = answer(client, multi_pool("greedy", "node-1", "node-2", "node-3"))
    assert denied["allowed"] is False and denied["status"]["reason"] == "DeviceAlreadyAllocated"
    for name in ("free-1", "free-2"):
        pool = name.replace("free", "node")
        assert answer(client, multi_pool(name, pool))["allowed"], f"{pool} kept the denied claim's record"
    held = [orjson.loads(lease["metadata"]["annotations"][ANNOTATION]) for lease in cluster.leases.values()]
    assert not any(entry["claim"] == "uid-ml-greedy" for entries in held for entry in entries)


# -- 2. one budget for the whole decision ------------------------------------------------------


def many_pools(count: int):
    slices = [
        resource_slice(f"node-{i}-gpus", pool=f"node-{i}", node_name=f"node-{i}", devices=gpus("gpu-0"))
        for i in range(count)
    ]
    return state_with(slices=slices, nodes=tuple(f"node-{i}" for i in range(count)))


def test_a_decision_over_many_slow_pools_answers_within_its_budget_with_reservation_busy(tmp_path, leases):
    cluster, store = leases
    cluster.lease_delay = 0.3
    config = {"policies": {"nodeAdmission": {"reservations": {"budgetSeconds": 1.5}}}}
    client = guard_client(many_pools(8), tmp_path, config, leases=store)
    started = time.monotonic()
    response = answer(client, multi_pool("wide", *(f"node-{i}" for i in range(8))))
    took = time.monotonic() - started
    assert took < 1.5 + 0.35, f"answered after {took:.2f} s"
    assert response["allowed"] is False and response["status"]["reason"] == "ReservationBusy"
    assert response["status"]["code"] == 429
    # Nothing it wrote before the budget ran out holds a device.
    time.sleep(0.35)
    cluster.lease_delay = 0
    assert answer(client, multi_pool("next", "node-0"))["allowed"]


# -- 4. record what counts, nothing else ---------------------------------------------------------


def deep(levels: int) -> dict:
    value: dict = {"leaf": True}
    for _ in range(levels):
        value = {"nested": value}
    return value


def test_opaque_parameters_nested_past_the_json_limit_are_not_recorded_and_the_device_is_held(tmp_path):
    review = wants("a", "gpu-1")
    allocation = review["request"]["object"]["status"]["allocation"]
    allocation["devices"]["config"] = [
        {"source": "FromClaim", "opaque": {"driver": "gpu.example.com", "parameters": deep(300)}}
    ]
    client = guard_client(one_gpu_left(), tmp_path)
    first = answer(client, review)
    assert first["allowed"] is True and "warnings" not in first, first
    second = answer(client, wants("b", "gpu-1"))
    assert second["allowed"] is False and second["status"]["reason"] == "DeviceAlreadyAllocated"


def test_a_record_holds_results_shares_and_consumed_capacity_only(tmp_path, leases):
    cluster, store = leases
    review = wants("a", "gpu-1")
    obj = review["request"]["object"]
    obj["status"]["allocation"]["devices"]["results"][0]["junk"] = "x" * 261_600
    obj["status"]["allocation"]["devices"]["config"] = [{"opaque": {"parameters": {"p": "q" * 1000}}}]
    obj["status"]["allocation"]["extra"] = "y" * 1000
    client = guard_client(one_gpu_left(), tmp_path, leases=store)
    assert answer(client, review)["allowed"]
    [lease] = cluster.leases.values()
    stored = lease["metadata"]["annotations"][ANNOTATION]
    assert len(stored) < 1024, stored[:300]
    [entry] = orjson.loads(stored)
    [kept] = entry["record"]["status"]["allocation"]["devices"]["results"]
    assert kept == {"request": "gpu", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-1"}
    assert not answer(client, wants("b", "gpu-1"))["allowed"]


def test_a_pool_lease_the_api_server_refuses_as_too_large_denies_busy_never_allows_unchecked(
    tmp_path, leases
):
    cluster, store = leases
    state = one_gpu_left()
    far = time.time() + 3600
    filler = [
        {"claim": f"uid-{i}", "version": "1", "expires": far,
         "record": {"metadata": {"namespace": "ml", "name": f"f{i}", "uid": f"uid-{i}"},
                    "status": {"allocation": {"devices": {"results": [
                        {"request": "gpu", "driver": "gpu.example.com", "pool": "node-1",
                         "device": "gpu-0", "adminAccess": True, "pad": "z" * 200}]}}}}}
        for i in range(540)
    ]  # fmt: skip
    filler[-1]["record"]["status"]["allocation"]["devices"]["results"][0]["pad"] = ""
    room = 262_144 - len(ANNOTATION) - len(orjson.dumps(filler))
    filler[-1]["record"]["status"]["allocation"]["devices"]["results"][0]["pad"] = "z" * (room - 100)
    annotation = orjson.dumps(filler).decode()  # 100 bytes short of the API server's limit
    cluster.leases[("admit-guard", POOL_LEASE)] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": POOL_LEASE, "namespace": "admit-guard",
                     "resourceVersion": "5", "annotations": {ANNOTATION: annotation}},
    }  # fmt: skip
    client = guard_client(state, tmp_path, leases=store)
    response = answer(client, wants("a", "gpu-1"))
    assert response["allowed"] is False and response["status"]["reason"] == "ReservationBusy", response


def test_expired_records_are_pruned_so_a_full_lease_takes_the_new_one(tmp_path, leases):
    cluster, store = leases
    past = time.time() - 10
    filler = [
        {"claim": f"uid-{i}", "version": "1", "expires": past,
         "record": {"metadata": {"namespace": "ml", "name": f"f{i}", "uid": f"uid-{i}"},
                    "status": {"allocation": {"devices": {"results": [
                        {"request": "gpu", "driver": "gpu.example.com", "pool": "node-1",
                         "device": "gpu-1", "pad": "z" * 200}]}}}}}
        for i in range(520)
    ]  # fmt: skip
    cluster.leases[("admit-guard", POOL_LEASE)] = {
        "metadata": {"name": POOL_LEASE, "namespace": "admit-guard",
                     "resourceVersion": "5", "annotations": {ANNOTATION: orjson.dumps(filler).decode()}},
    }  # fmt: skip
    client = guard_client(one_gpu_left(), tmp_path, leases=store)
    assert answer(client, wants("a", "gpu-1"))["allowed"]
    assert not answer(client, wants("b", "gpu-1"))["allowed"]


# -- 5. bounded side effects ----------------------------------------------------------------------


def test_pools_the_state_does_not_know_create_no_lease(tmp_path, leases):
    cluster, store = leases
    client = guard_client(one_gpu_left(), tmp_path, leases=store)
    results = [result("gpu-0", pool=f"ghost-{i}") for i in range(20)]
    review = status_update(claim("ghosts", namespace="ml", results=results, node=None))
    response = answer(client, review)
    assert response["allowed"] is True
    assert any("ghost-0" in w for w in response.get("warnings", [])), response
    assert cluster.leases == {} and cluster.lease_writes == 0


def test_an_allocation_with_more_results_than_the_api_allows_is_denied_without_writing(tmp_path, leases):
    cluster, store = leases
    client = guard_client(one_gpu_left(), tmp_path, leases=store)
    results = [result(f"gpu-{i}", pool=f"pool-{i}") for i in range(1000)]
    response = answer(client, status_update(claim("forged", namespace="ml", results=results, node=None)))
    assert response["allowed"] is False
    assert "32" in response["status"]["message"]
    assert cluster.leases == {} and cluster.lease_writes == 0


def test_a_pool_lease_whose_last_record_ended_is_deleted(tmp_path, leases):
    from webhook.coordination.allocations import kept

    cluster, store = leases
    now = [time.time()]
    state = one_gpu_left()
    state.devices.set_claim(claim_at("a", "40"))
    client = guard_client(state, tmp_path, leases=store, clock=lambda: now[0])
    assert answer(client, wants("a", "gpu-1", version="41"))["allowed"]
    assert len(cluster.leases) == 1
    pools = pool_leases(store.api, "admit-guard")
    assert collect_ended(pools, kept, FixedState(state), now[0]) == 0  # still in flight
    state.devices.set_claim(claim_at("a", "42", results=[result("gpu-1")]))
    state.devices.set_claim(claim_at("a", "43"))  # landed, then deallocated
    assert collect_ended(pools, kept, FixedState(state), now[0]) == 1
    assert cluster.leases == {} and cluster.lease_deletes == 1


# -- 7. smaller ------------------------------------------------------------------------------------


def test_a_dry_run_allocation_of_a_device_held_in_flight_is_denied_like_the_real_write(tmp_path):
    client = guard_client(one_gpu_left(), tmp_path)
    assert answer(client, wants("a", "gpu-1"))["allowed"]
    dry = answer(client, wants("b", "gpu-1", dry_run=True))
    assert dry["allowed"] is False and dry["status"]["reason"] == "DeviceAlreadyAllocated"
    assert answer(client, wants("c", "gpu-0", dry_run=True))["allowed"] is False  # the index's


def test_a_dry_run_allocation_reserves_nothing_even_through_the_leases(tmp_path, leases):
    cluster, store = leases
    client = guard_client(one_gpu_left(), tmp_path, leases=store)
    assert answer(client, wants("a", "gpu-1", dry_run=True))["allowed"]
    assert cluster.lease_writes == 0
    assert answer(client, wants("b", "gpu-1"))["allowed"]


@pytest.mark.parametrize("annotations", ["not a map", ["a", "list"], {ANNOTATION: 7}, {ANNOTATION: "{"}])
def test_a_lease_with_unreadable_annotations_is_replaced_without_a_traceback(tmp_path, leases, annotations):
    cluster, store = leases
    name = POOL_LEASE
    cluster.leases[("admit-guard", name)] = {
        "metadata": {
            "name": name,
            "namespace": "admit-guard",
            "resourceVersion": "5",
            "annotations": annotations,
        }
    }
    client = guard_client(one_gpu_left(), tmp_path, leases=store)
    first = answer(client, wants("a", "gpu-1"))
    assert first["allowed"] is True and "warnings" not in first, first
    assert not answer(client, wants("b", "gpu-1"))["allowed"]


def test_a_pool_lost_to_a_sibling_after_others_were_written_is_undone_in_those_others(
    tmp_path, leases, monkeypatch
):
    """Between this decision's read of pool node-2 and its write, a sibling on another replica
    records gpu-0 of node-2 for its own claim: the write gets 409, the allocation is judged
    again and denied, and its record in node-1 (already written) is taken out."""

    cluster, store = leases
    state = three_pools()
    sibling = guard_client(state, tmp_path / "sibling", leases=store)
    client = guard_client(state, tmp_path / "this", leases=store)
    real_write = LeaseStore.write
    raced = []

    def write(self, read, records, budget):
        if read.name.endswith(bounded_name("", "gpu.example.com/node-2", 253)) and not raced:
            raced.append(None)  # once: the sibling's own write comes through here too
            raced[0] = answer(sibling, multi_pool("sibling", "node-2"))
        return real_write(self, read, records, budget)

    monkeypatch.setattr(LeaseStore, "write", write)
    denied = answer(client, multi_pool("both", "node-1", "node-2"))
    assert raced and raced[0]["allowed"]
    assert denied["allowed"] is False and denied["status"]["reason"] == "DeviceAlreadyAllocated"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        held = [
            lease["metadata"].get("annotations", {}).get(ANNOTATION, "[]")
            for lease in cluster.leases.values()
        ]
        if not any(e["claim"] == "uid-ml-both" for h in held for e in orjson.loads(h)):
            break
        time.sleep(0.02)
    else:
        raise AssertionError(f"the denied claim's record stayed: {held}")
    assert answer(guard_client(state, tmp_path / "third", leases=store), multi_pool("next", "node-1"))[
        "allowed"
    ]


def test_the_servers_collector_deletes_node_and_pool_leases_whose_records_ended_and_keeps_the_rest(leases):
    from webhook.coordination.allocations import kept as allocation_kept
    from webhook.coordination.reservations import Reservation, kept, lease_name
    from webhook.serve.lease_collector import LeaseCollector

    cluster, store = leases
    pools = pool_leases(store.api, "admit-guard")
    now = time.time()
    ended = Reservation("uid-gone", "node-1", {"cpu": 1000}, (), now - 1)
    live = Reservation("uid-live", "node-2", {"cpu": 1000}, (), now + 60)
    for reservation in (ended, live):
        store.update(reservation.node, lambda _, r=reservation: [r], Budget.start(1, 1))
    cluster.leases[("admit-guard", "unrelated")] = {"metadata": {"name": "unrelated", "resourceVersion": "1"}}
    state = one_gpu_left()
    collector = LeaseCollector(FixedState(state), [(store, kept), (pools, allocation_kept)], interval=60)
    assert collector.run_once() == 1
    assert set(name for _, name in cluster.leases) == {lease_name("node-2"), "unrelated"}


# -- a rolling update: the previous version's replicas and the new ones coordinate -------------------

PREVIOUS_ALLOCATION_RECORD = (
    '[{"claim":"uid-ml-old","version":"41","record":{"metadata":{"namespace":"ml","name":"old",'
    '"uid":"uid-ml-old"},"status":{"allocation":{"devices":{"results":[{"device":"gpu-1",'
    '"driver":"gpu.example.com","pool":"node-1","request":"gpu"}]},"nodeSelector":{"nodeSelectorTerms":'
    '[{"matchFields":[{"key":"metadata.name","operator":"In","values":["node-1"]}]}]}}}},'
    '"expires":%f,"confirmBy":%f}]'
)


def test_a_previous_versions_allocation_record_in_a_pools_lease_holds_its_device(tmp_path, leases):
    cluster, store = leases
    later = time.time() + 60
    cluster.leases[("admit-guard", POOL_LEASE)] = {
        "metadata": {"name": POOL_LEASE, "namespace": "admit-guard", "resourceVersion": "5",
                     "annotations": {ANNOTATION: PREVIOUS_ALLOCATION_RECORD % (later, later)}},
    }  # fmt: skip
    client = guard_client(one_gpu_left(), tmp_path, leases=store)
    denied = answer(client, wants("b", "gpu-1"))
    assert denied["allowed"] is False and "ml/old" in denied["status"]["message"]


def test_the_new_records_read_as_the_previous_version_reads_them(tmp_path, leases):
    """The previous version took a record's devices with ``claim_allocation_from(record)`` and a
    reservation's with ``pod``, ``node``, ``requests``, ``hostPorts``, ``expires``."""
    from webhook.kube.dra import claim_allocation_from

    cluster, store = leases
    client = guard_client(one_gpu_left(), tmp_path, leases=store)
    assert answer(client, wants("a", "gpu-1"))["allowed"]
    [entry] = orjson.loads(cluster.leases[("admit-guard", POOL_LEASE)]["metadata"]["annotations"][ANNOTATION])
    key, allocation = claim_allocation_from(entry["record"])
    assert key == "uid-ml-a" and [r.key for r in allocation.results] == [
        ("gpu.example.com", "node-1", "gpu-1")
    ]
    assert {"claim", "version", "record", "expires"} <= set(entry)


def test_a_previous_versions_reservation_without_a_scheduler_still_holds_capacity():
    from webhook.coordination.reservations import Reservation

    old = {
        "pod": "uid-a",
        "node": "gpu-1",
        "requests": {"nvidia.com/gpu": 1},
        "hostPorts": [],
        "expires": 9e9,
    }
    reservation = Reservation.from_json(old)
    assert (
        reservation is not None
        and reservation.scheduler == ""
        and reservation.requests == {"nvidia.com/gpu": 1}
    )
    assert set(old) <= set(Reservation.from_json({**old, "scheduler": "volcano"}).as_json())


# -- each object read once, judged once (issue 26) ---------------------------------------------------


def test_an_allowed_allocation_is_read_once_and_judged_once_through_the_server(tmp_path, leases, monkeypatch):
    from webhook import allocation
    from webhook.policies import device_allocation

    _, store = leases
    calls = {"read": 0, "judge": 0}
    real_read, real_judge = allocation.resource_claim_from, device_allocation.judge_allocation

    def read(obj):
        calls["read"] += 1
        return real_read(obj)

    def judge(*args, **kwargs):
        calls["judge"] += 1
        return real_judge(*args, **kwargs)

    monkeypatch.setattr(allocation, "resource_claim_from", read)
    monkeypatch.setattr(device_allocation, "judge_allocation", judge)
    client = guard_client(one_gpu_left(), tmp_path, leases=store)
    assert answer(client, wants("a", "gpu-1"))["allowed"]
    assert calls == {"read": 1, "judge": 1}


def test_a_binding_is_read_once_through_the_server(tmp_path, monkeypatch):
    from tests.helpers.binds import binding, gpu_pod
    from tests.helpers.binds import state_with as pods_state
    from tests.helpers.builders import node
    from webhook import binding as bind_module
    from webhook import pipeline
    from webhook.binding import BindGuard

    reads = []
    real = bind_module.binding_target

    def counted(req):
        reads.append(req.uid)
        return real(req)

    monkeypatch.setattr(bind_module, "binding_target", counted)
    monkeypatch.setattr(pipeline, "binding_target", counted)
    state = pods_state(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("a"))
    conf = config_from_dict({})
    guard = BindGuard(conf, node_table(tmp_path / "t"))
    client = create_app(conf, FixedState(state), bind_guard=guard).test_client()
    assert client.post("/validate", json=binding("a", "gpu-1")).get_json()["response"]["allowed"]
    assert reads == ["bind-a"]
