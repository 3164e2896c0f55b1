"""DRA at admission: ``resourceclaims/status`` writes judged against every other claim and the
allocations still in flight, and pods pinned with nodeName whose claims no kubelet can prepare."""

from __future__ import annotations

import copy

from tests.helpers.app import answer
from tests.helpers.builders import node, pod
from tests.helpers.claims import SCHEDULER, client_for, one_gpu_left, state_with, status_update
from tests.helpers.dra_builders import claim, gpus, resource_slice, result
from webhook.allocation import AllocationGuard
from webhook.config import config_from_dict
from webhook.coordination.allocations import pool_table
from webhook.coordination.reservations import node_table
from webhook.serve.app import create_app
from webhook.state import ClusterState, node_from
from webhook.state.source import FixedState


def test_an_allocation_of_a_device_another_claim_holds_is_denied_naming_device_holder_and_writer(tmp_path):
    late = claim("late", namespace="ml", results=[result("gpu-0")])
    response = answer(client_for(one_gpu_left(), tmp_path), status_update(late))
    assert response["allowed"] is False
    assert response["status"]["reason"] == "DeviceAlreadyAllocated"
    message = response["status"]["message"]
    assert "gpu.example.com/node-1/gpu-0" in message and "ml/holder" in message and SCHEDULER in message
    assert "retries" in message


def test_a_free_device_is_allowed_and_the_next_write_for_it_is_denied_by_the_allocation_in_flight(tmp_path):
    client = client_for(one_gpu_left(), tmp_path)
    first = answer(client, status_update(claim("a", namespace="ml", results=[result("gpu-1")])))
    assert first["allowed"] is True
    second = answer(client, status_update(claim("b", namespace="ml", results=[result("gpu-1")])))
    assert second["allowed"] is False and second["status"]["reason"] == "DeviceAlreadyAllocated"
    assert "ml/a" in second["status"]["message"]


def _allocated_and_observed(client, state) -> None:
    """ml/a takes gpu-1 through the guard, then the watch shows the write (its record stops
    counting: the index holds the allocation)."""
    winner = claim("a", namespace="ml", results=[result("gpu-1")])
    assert answer(client, status_update(winner))["allowed"]
    landed = copy.deepcopy(winner)
    landed["metadata"]["resourceVersion"] = "42"
    state.devices.set_claim(landed)


def test_once_the_winners_allocation_is_observed_later_writes_are_denied_by_the_index(tmp_path):
    state = one_gpu_left()
    client = client_for(state, tmp_path)
    _allocated_and_observed(client, state)
    denied = answer(client, status_update(claim("b", namespace="ml", results=[result("gpu-1")])))
    assert denied["allowed"] is False and "ml/a" in denied["status"]["message"]


def test_a_deallocation_frees_the_device_at_once(tmp_path):
    state = one_gpu_left()
    client = client_for(state, tmp_path)
    _allocated_and_observed(client, state)
    freed = claim("a", namespace="ml")
    freed["metadata"]["resourceVersion"] = "43"
    state.devices.set_claim(freed)  # deallocated, well within the TTL
    assert answer(client, status_update(claim("b", namespace="ml", results=[result("gpu-1")])))["allowed"]


def test_a_dry_run_allocation_reserves_nothing(tmp_path):
    client = client_for(one_gpu_left(), tmp_path)
    assert answer(client, status_update(claim("a", namespace="ml", results=[result("gpu-1")]), dry_run=True))[
        "allowed"
    ]
    assert answer(client, status_update(claim("b", namespace="ml", results=[result("gpu-1")])))["allowed"]


def test_an_allocation_in_flight_ends_with_its_ttl(tmp_path):
    now = [1000.0]
    config = {"policies": {"nodeAdmission": {"reservations": {"ttlSeconds": 30}}}}
    client = client_for(one_gpu_left(), tmp_path, config, clock=lambda: now[0])
    assert answer(
        client, status_update(claim("a", namespace="ml", results=[result("gpu-1")]), user=SCHEDULER)
    )
    now[0] += 31
    second = answer(client, status_update(claim("b", namespace="ml", results=[result("gpu-1")])))
    assert second["allowed"] is True


def test_other_transitions_are_allowed_untouched(tmp_path):
    client = client_for(one_gpu_left(), tmp_path)
    held = claim("holder", namespace="ml", results=[result("gpu-0")])
    rewrite = status_update(held)
    rewrite["request"]["oldObject"] = copy.deepcopy(held)  # set → set: a reservedFor change
    assert answer(client, rewrite)["allowed"] is True
    cleared = status_update(claim("holder", namespace="ml"))
    cleared["request"]["oldObject"] = held  # set → nil: a deallocation
    assert answer(client, cleared)["allowed"] is True


def test_without_device_state_an_allocation_is_allowed_with_a_warning(tmp_path):
    client = client_for(ClusterState(), tmp_path)
    response = answer(client, status_update(claim("a", namespace="ml", results=[result("gpu-1")])))
    assert response["allowed"] is True and "NoDeviceState" in response["warnings"][0]


def test_warn_mode_allows_a_conflicting_allocation_with_a_warning(tmp_path):
    client = client_for(one_gpu_left(), tmp_path, {"policies": {"deviceAllocation": {"mode": "warn"}}})
    response = answer(client, status_update(claim("late", namespace="ml", results=[result("gpu-0")])))
    assert response["allowed"] is True and "DeviceAlreadyAllocated" in response["warnings"][0]


# -- pods pinned with nodeName ------------------------------------------------------------------


def pinned(claims: list[dict]) -> dict:
    obj = pod("trainer", namespace="ml", node_name="node-1", resourceClaims=claims)
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "p", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": "ml",
                    "operation": "CREATE", "object": obj},
    }  # fmt: skip


def test_a_pinned_pod_with_a_claim_from_a_template_is_failed_prepare_dynamic_resources(tmp_path):
    response = answer(
        client_for(one_gpu_left(), tmp_path), pinned([{"name": "gpu", "resourceClaimTemplateName": "t"}])
    )
    assert response["allowed"] is False
    assert response["status"]["reason"] == "FailedPrepareDynamicResources"
    assert "node affinity" in response["status"]["message"]


def test_a_pinned_pod_naming_an_unallocated_claim_is_denied(tmp_path):
    state = one_gpu_left()
    state.devices.set_claim(claim("waiting", namespace="ml"))
    response = answer(client_for(state, tmp_path), pinned([{"name": "gpu", "resourceClaimName": "waiting"}]))
    assert response["allowed"] is False and response["status"]["reason"] == "FailedPrepareDynamicResources"


def test_a_pinned_pod_naming_a_claim_that_does_not_exist_yet_is_allowed_with_a_warning(tmp_path):
    response = answer(
        client_for(one_gpu_left(), tmp_path), pinned([{"name": "gpu", "resourceClaimName": "later"}])
    )
    assert response["allowed"] is True and "does not exist" in response["warnings"][0]


def test_a_pinned_pod_naming_a_claim_allocated_for_another_node_is_denied(tmp_path):
    state = one_gpu_left()
    state.set_node(node_from(node("node-2")))
    response = answer(client_for(state, tmp_path), pinned([{"name": "gpu", "resourceClaimName": "holder"}]))
    assert response["allowed"] is True  # allocated for node-1, where it is pinned
    moved = pinned([{"name": "gpu", "resourceClaimName": "holder"}])
    moved["request"]["object"]["spec"]["nodeName"] = "node-2"
    denied = answer(client_for(state, tmp_path), moved)
    assert denied["allowed"] is False and "excludes node-2" in denied["status"]["message"]


# -- snapshots ----------------------------------------------------------------------------------


def test_a_snapshot_with_dra_objects_carries_the_device_index(tmp_path):
    import yaml

    from webhook.state.snapshot import load_snapshot

    holder = claim("holder", namespace="ml", results=[result("gpu-0")])
    docs = [node("node-1"), resource_slice(devices=gpus("gpu-0", "gpu-1")), holder]
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump_all(docs))
    state = load_snapshot([str(tmp_path / "cluster.yaml")])
    assert state.devices is not None and state.devices.use(("gpu.example.com", "node-1", "gpu-0"))
    assert load_snapshot([str(tmp_path / "cluster.yaml")]).devices.named("ml", "holder") is not None


def test_a_bind_of_a_pod_whose_claim_is_allocated_for_another_node_is_denied(tmp_path):
    from tests.helpers.binds import binding, review_of
    from webhook.binding import BindGuard
    from webhook.state import pod_record

    state = one_gpu_left()
    state.set_node(node_from(node("node-2")))
    trainer = pod(
        "trainer",
        namespace="ml",
        uid="uid-trainer",
        resourceClaims=[{"name": "gpu", "resourceClaimName": "mine"}],
    )
    state.set_pod("uid-trainer", pod_record(trainer))
    state.devices.set_claim(claim("mine", namespace="ml", results=[result("gpu-1")], node="node-1"))
    guard = BindGuard(config_from_dict({}), node_table(tmp_path / "t"))
    denied = guard.review(review_of(binding("trainer", "node-2", uid="uid-trainer")), FixedState(state))
    assert not denied.allowed and denied.reasons == ["FailedPrepareDynamicResources"]
    assert guard.review(review_of(binding("trainer", "node-1", uid="uid-trainer")), FixedState(state)).allowed


# -- the audit ------------------------------------------------------------------------------------


def test_the_audit_reports_a_device_handed_out_twice_with_both_claims_and_their_pods():
    from webhook.audit import Report, policy_reports, run_audit
    from webhook.state.inventory import Inventory

    first = claim("a", namespace="ml", results=[result("gpu-0")], reserved_for=["trainer-a"])
    second = claim("b", namespace="ml", results=[result("gpu-0")], reserved_for=["trainer-b"])
    state = state_with(slices=[resource_slice(devices=gpus("gpu-0", "gpu-1"))], claims=[first, second])
    [found] = run_audit(Inventory(state), config_from_dict({}), 1000.0).findings
    assert found.type == "DeviceAlreadyAllocated" and found.count == 2 and found.severity == "high"
    assert found.resource == "gpu.example.com/node-1/gpu-0"
    assert "ml/a (pods trainer-a)" in found.message and "ml/b (pods trainer-b)" in found.message
    reports = policy_reports(Report([found], {}), 1000.0)
    assert any(r["policy"] == "deviceAllocation" for report in reports for r in report.get("results", []))


def test_the_audit_of_devices_follows_the_policy_mode():
    from webhook.audit import run_audit
    from webhook.state.inventory import Inventory

    first = claim("a", namespace="ml", results=[result("gpu-0")])
    second = claim("b", namespace="ml", results=[result("gpu-0")])
    state = state_with(slices=[resource_slice(devices=gpus("gpu-0"))], claims=[first, second])
    config = config_from_dict({"policies": {"deviceAllocation": {"mode": "off"}}})
    assert run_audit(Inventory(state), config, 1000.0).findings == []


def test_the_periodic_audit_counts_devices_handed_out_twice():
    from tests.helpers.audit_gauges import ScrapedGauges
    from webhook.serve.periodic_audit import PeriodicAudit

    first = claim("a", namespace="ml", results=[result("gpu-0")])
    second = claim("b", namespace="ml", results=[result("gpu-0")])
    state = state_with(slices=[resource_slice(devices=gpus("gpu-0"))], claims=[first, second])
    metrics = ScrapedGauges()
    found = PeriodicAudit(FixedState(state), config_from_dict({}), metrics, 60).run_once()
    assert [f.type for f in found] == ["DeviceAlreadyAllocated"]
    assert 'admit_guard_audit_findings{namespace="ml",type="DeviceAlreadyAllocated"} 1.0' in metrics.scrape()


def test_a_read_only_allocation_table_still_coordinates_through_the_pools_lease(
    tmp_path, leases, monkeypatch
):
    import errno

    from webhook.coordination import table as reservations
    from webhook.coordination.allocations import pool_leases

    _, store = leases

    def read_only(self, path, codec):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(reservations._TableFile, "__init__", read_only)
    conf = config_from_dict({})
    table, pool_leases = pool_table(tmp_path / "t"), pool_leases(store.api, "admit-guard")
    guard = AllocationGuard(conf, table, pool_leases)
    client = create_app(conf, FixedState(one_gpu_left()), allocation_guard=guard).test_client()
    first = answer(client, status_update(claim("a", namespace="ml", results=[result("gpu-1")])))
    assert first["allowed"] is True and "warnings" not in first
    second = answer(client, status_update(claim("b", namespace="ml", results=[result("gpu-1")])))
    assert second["allowed"] is False and second["status"]["reason"] == "DeviceAlreadyAllocated"
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'admit_guard_reservation_table_trouble_total{reason="table-error"} 2.0' in metrics


def test_an_allocation_written_by_an_identity_the_allocators_do_not_include_is_a_mixed_scheduler_warning(
    tmp_path,
):
    config = {"policies": {"deviceScheduler": {"allocators": {"gpu.example.com": [SCHEDULER]}}}}
    client = client_for(one_gpu_left(), tmp_path, config)
    volcano = "system:serviceaccount:volcano-system:volcano-scheduler"
    response = answer(
        client, status_update(claim("a", namespace="ml", results=[result("gpu-1")]), user=volcano)
    )
    assert response["allowed"] is True
    assert "MixedDeviceScheduler" in response["warnings"][0] and volcano in response["warnings"][0]
    ours = answer(client, status_update(claim("b", namespace="ml", results=[result("gpu-1")])))
    assert "warnings" not in ours or not any("MixedDeviceScheduler" in w for w in ours["warnings"])
