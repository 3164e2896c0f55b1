"""DRA allocations: the rules of dra-allocation-spec.md §5, each naming the upstream function it
follows, plus the readers, the incremental index, and the arithmetic properties."""

from __future__ import annotations

import copy
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.dra_builders import DRIVER, claim, device, gpus, request, resource_slice, result
from webhook.dra.judge import (
    REASONS,
    consumed_from_request,
    judge_allocation,
    missing_pools,
    reasons,
)
from webhook.kube.dra import (
    NANO,
    Capacity,
    RequestPolicy,
    ValidRange,
    allocation_written,
    format_nano,
    resource_claim_from,
    resource_slice_from,
)
from webhook.kube.errors import FieldError
from webhook.kube.tolerations import Taint
from webhook.state.devices import DeviceIndex, index_of

GI = 1024**3 * NANO


def judged(new, *, slices=(), claims=(), in_flight=(), rules=()):
    index = index_of(slices=slices, claims=claims, taint_rules=rules)
    return judge_allocation(new, index, in_flight=[resource_claim_from(c).allocation for c in in_flight])


def codes(findings) -> list[str]:
    return [f.reason for f in findings]


NODE_1 = resource_slice(devices=gpus("gpu-0", "gpu-1"))


# --- §3 which write is judged ----------------------------------------------------------------------


def test_only_a_new_allocation_is_judged():
    """``validation.go: validateResourceClaimStatusUpdate``: an allocation is only ever set or
    cleared, so only nil → set needs judging; clearing, re-writes and reservedFor changes do not."""
    unallocated = claim("a")
    allocated = claim("a", results=[result("gpu-0")])
    reserved = claim("a", results=[result("gpu-0")], reserved_for=["p1", "p2"])
    assert allocation_written(unallocated, allocated)
    assert not allocation_written(allocated, unallocated)
    assert not allocation_written(allocated, reserved)
    assert not allocation_written(unallocated, unallocated)
    assert not allocation_written(None, unallocated)
    explicit_null = copy.deepcopy(allocated)
    explicit_null["status"]["allocation"] = None
    assert not allocation_written(explicit_null, unallocated)
    assert allocation_written(explicit_null, allocated)


# --- §5.1 which claims hold devices ----------------------------------------------------------------


def test_an_allocated_claim_holds_its_devices_even_unreserved_and_being_deleted():
    """``allocateddevices.go: onAdd/foreachAllocatedDevice``: only ``status.allocation`` matters;
    empty reservedFor and a deletionTimestamp still hold the device."""
    holder = claim("a", results=[result("gpu-0")])
    holder["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    findings = judged(claim("b", results=[result("gpu-0")]), slices=[NODE_1], claims=[holder])
    assert codes(findings) == ["DeviceAlreadyAllocated"]
    assert [str(h) for h in findings[0].holders] == ["default/a"]


def test_admin_access_results_hold_nothing():
    """``foreachAllocatedDevice``: a result with adminAccess is "not considered as allocated"."""
    monitor = claim("monitor", results=[result("gpu-0", admin=True)], requests=[request(adminAccess=True)])
    assert judged(claim("b", results=[result("gpu-0")]), slices=[NODE_1], claims=[monitor]) == []


def test_a_deallocated_or_deleted_claim_frees_its_devices_at_once():
    """``allocatedDevices.onUpdate`` (set → nil) and ``onDelete`` remove the devices."""
    index = index_of(slices=[NODE_1], claims=[claim("a", results=[result("gpu-0")])])
    new = claim("b", results=[result("gpu-0")])
    assert codes(judge_allocation(new, index)) == ["DeviceAlreadyAllocated"]
    index.set_claim(claim("a"))  # the resourceclaim controller clears the allocation
    assert judge_allocation(new, index) == []
    index.set_claim(claim("a", results=[result("gpu-0")]))
    index.remove_claim("uid-default-a")
    assert judge_allocation(new, index) == []


def test_the_claim_under_review_never_conflicts_with_itself():
    """Spec §5.1: the claim is matched by ``metadata.uid`` and judged against the *other* claims
    (its own in-flight record or a stale index entry never counts)."""
    itself = claim("a", results=[result("gpu-0")])
    assert judged(itself, slices=[NODE_1], claims=[itself], in_flight=[itself]) == []


# --- §5.2 exclusive use ------------------------------------------------------------------------------


def test_a_device_another_claim_holds_is_already_allocated():
    """``allocator_experimental.go: allocateDevice`` → ``deviceInUse`` (``AllocatedDevices.Has``)."""
    findings = judged(
        claim("b", namespace="team-b", results=[result("gpu-1"), result("gpu-0")]),
        slices=[NODE_1],
        claims=[claim("a", namespace="team-a", results=[result("gpu-0")])],
    )
    assert codes(findings) == ["DeviceAlreadyAllocated"]
    assert findings[0].device == f"{DRIVER}/node-1/gpu-0"
    assert "team-a/a" in findings[0].message


def test_the_same_device_name_in_another_pool_is_another_device():
    """``allocatedstate.go: DeviceID`` / ``MakeDeviceID``: identity is (driver, pool, device)."""
    node_2 = resource_slice("node-2-gpus", pool="node-2", node_name="node-2", devices=gpus("gpu-0"))
    other_driver = resource_slice("nic", driver="nic.example.com", devices=gpus("gpu-0"))
    holders = [
        claim("a", results=[result("gpu-0", pool="node-2")]),
        claim("n", results=[result("gpu-0", driver="nic.example.com")]),
    ]
    assert (
        judged(claim("b", results=[result("gpu-0")]), slices=[NODE_1, node_2, other_driver], claims=holders)
        == []
    )


def test_a_share_id_does_not_get_past_an_exclusive_holder():
    """``allocateDevice``: ``deviceInUse`` is checked before any capacity logic (§5.2 rule 2)."""
    nic = resource_slice(devices=[device("nic-0", multi=True, capacity={"bandwidth": "10G"})])
    findings = judged(
        claim("b", results=[result("nic-0", share_id="s-b", consumed={"bandwidth": "1G"})]),
        slices=[nic],
        claims=[claim("a", results=[result("nic-0")])],
    )
    assert codes(findings) == ["DeviceAlreadyAllocated"]


def test_one_device_twice_in_one_allocation_is_already_allocated():
    """``allocatingDevices`` is shared by all requests of a claim: one device fills one slot."""
    findings = judged(
        claim(
            "b",
            requests=[request("x"), request("y")],
            results=[result("gpu-0", req="x"), result("gpu-0", req="y")],
        ),
        slices=[NODE_1],
    )
    assert codes(findings) == ["DeviceAlreadyAllocated"]
    assert "twice" in findings[0].message


def test_admin_access_is_never_blocked_by_other_claims():
    """``allocateDevice``: admin requests skip ``deviceInUse``."""
    new = claim("monitor", requests=[request(adminAccess=True)], results=[result("gpu-0", admin=True)])
    assert judged(new, slices=[NODE_1], claims=[claim("a", results=[result("gpu-0")])]) == []


def test_admin_access_may_not_name_a_device_twice_in_its_claim():
    """``allocateDevice``: ``adminAccess && allocatingDeviceForClaim`` refuses the second entry."""
    new = claim(
        "monitor",
        requests=[request("x", adminAccess=True), request("y")],
        results=[result("gpu-0", req="x", admin=True), result("gpu-0", req="y")],
    )
    assert codes(judged(new, slices=[NODE_1])) == ["DeviceAlreadyAllocated"]


def test_in_flight_allocations_count_like_indexed_claims():
    """``dra_manager.go: claimTracker.ListAllAllocatedDevices`` adds in-flight allocations to the
    informer's: an allowed write not yet watched still holds its devices."""
    winner = claim("winner", results=[result("gpu-0")])
    findings = judged(claim("loser", results=[result("gpu-0")]), slices=[NODE_1], in_flight=[winner])
    assert codes(findings) == ["DeviceAlreadyAllocated"]
    assert [str(h) for h in findings[0].holders] == ["default/winner"]


def test_open_question_3_whole_device_next_to_shares_is_already_allocated():
    """Open question 3 (``foreachAllocatedDevice`` with the consumable-capacity gate off puts
    every result in the exclusive set): a result without shareID cannot join shares."""
    nic = resource_slice(devices=[device("nic-0", multi=True, capacity={"bandwidth": "10G"})])
    share = claim("a", results=[result("nic-0", share_id="s-a", consumed={"bandwidth": "1G"})])
    assert codes(judged(claim("b", results=[result("nic-0")]), slices=[nic], claims=[share])) == [
        "DeviceAlreadyAllocated"
    ]


def test_open_question_3_share_id_on_a_device_that_does_not_allow_sharing_is_exclusive():
    """Open question 3 / §5.2 rule 2: a shareID does not make a device shareable."""
    share = claim("a", results=[result("gpu-0", share_id="s-a")])
    new = claim("b", results=[result("gpu-0", share_id="s-b")])
    assert codes(judged(new, slices=[NODE_1], claims=[share])) == ["DeviceAlreadyAllocated"]


# --- §5.3 consumable capacity ------------------------------------------------------------------------

NIC = resource_slice(devices=[device("nic-0", multi=True, capacity={"bandwidth": "10G"})])


def share_claim(name: str, amount: str, *, requested: str | None = None, share: str | None = None):
    capacity = {"capacity": {"requests": {"bandwidth": requested or amount}}}
    return claim(
        name,
        requests=[request(**capacity)],
        results=[result("nic-0", share_id=share or f"s-{name}", consumed={"bandwidth": amount})],
    )


def test_shares_up_to_the_capacity_fit_and_one_more_exceeds_it():
    """``consumable_capacity.go: CmpRequestOverCapacity``: ``Cmp(cap.Value) > 0`` fails, so a sum
    equal to the capacity fits."""
    others = [share_claim("a", "4G"), share_claim("b", "4G")]
    assert judged(share_claim("c", "2G"), slices=[NIC], claims=others) == []
    findings = judged(share_claim("c", "3G"), slices=[NIC], claims=others)
    assert codes(findings) == ["DeviceCapacityExceeded"]
    assert {str(h) for h in findings[0].holders} == {"default/a", "default/b"}


def test_shares_of_one_claim_add_up():
    """``allocatingCapacity``: several results of the claim on one device consume together."""
    new = claim(
        "c",
        requests=[
            request("x", capacity={"requests": {"bandwidth": "4G"}}),
            request("y", capacity={"requests": {"bandwidth": "4G"}}),
        ],
        results=[
            result("nic-0", req="x", share_id="s1", consumed={"bandwidth": "4G"}),
            result("nic-0", req="y", share_id="s2", consumed={"bandwidth": "4G"}),
        ],
    )
    assert judged(new, slices=[NIC]) == []
    assert codes(judged(new, slices=[NIC], claims=[share_claim("a", "3G")])) == ["DeviceCapacityExceeded"]


def test_an_understated_consumed_capacity_counts_as_much_as_its_request():
    """``GetConsumedCapacityFromRequest``: the consumption follows from the request; a record
    below it cannot squeeze a share in."""
    others = [share_claim("a", "8G")]
    assert codes(judged(share_claim("c", "1", requested="4G"), slices=[NIC], claims=others)) == [
        "DeviceCapacityExceeded"
    ]


def test_a_capacity_the_request_does_not_name_is_taken_whole():
    """``calculateConsumedCapacity`` → ``fillEmptyRequest``: no request and no policy default
    means the whole capacity."""
    new = claim("c", results=[result("nic-0", share_id="s-c", consumed={})])
    assert codes(judged(new, slices=[NIC], claims=[share_claim("a", "1")])) == ["DeviceCapacityExceeded"]
    assert judged(new, slices=[NIC]) == []


@pytest.mark.parametrize(
    ("requested", "policy", "consumed"),
    [
        (None, None, 10),
        (None, RequestPolicy(default=2), 2),
        (3, None, 3),
        (1, RequestPolicy(valid_range=ValidRange(min=2)), 2),
        (5, RequestPolicy(valid_range=ValidRange(min=2, step=2)), 6),
        (6, RequestPolicy(valid_range=ValidRange(min=2, step=2)), 6),
        (3, RequestPolicy(valid_values=(1, 4, 8)), 4),
        (9, RequestPolicy(valid_values=(1, 4, 8)), 9),
    ],
)
def test_consumption_follows_the_request_policy(requested, policy, consumed):
    """``calculateConsumedCapacity``, ``roundUpRange``, ``roundUpValidValues`` (units: whole)."""
    capacity = Capacity(10 * NANO, policy)
    if policy is not None:
        policy = RequestPolicy(
            None if policy.default is None else policy.default * NANO,
            tuple(v * NANO for v in policy.valid_values),
            policy.valid_range
            and ValidRange(
                policy.valid_range.min * NANO,
                None,
                policy.valid_range.step and policy.valid_range.step * NANO,
            ),
        )
        capacity = Capacity(10 * NANO, policy)
    amount = None if requested is None else requested * NANO
    assert consumed_from_request(amount, capacity) == consumed * NANO


def test_open_question_5_a_capacity_named_with_the_driver_domain_is_the_same_capacity():
    """Open question 5: ``<driver>/bandwidth`` and ``bandwidth`` are one capacity of the device."""
    prefixed = claim("a", results=[result("nic-0", share_id="s-a", consumed={f"{DRIVER}/bandwidth": "8G"})])
    assert codes(judged(share_claim("c", "4G"), slices=[NIC], claims=[prefixed])) == [
        "DeviceCapacityExceeded"
    ]


# --- §5.4 pools and generations ----------------------------------------------------------------------


def test_a_device_missing_from_a_complete_current_pool_is_not_in_slice():
    """``pools_experimental.go: GatherPools`` (``isComplete``): a complete pool lists every device."""
    findings = judged(claim("b", results=[result("gpu-7")]), slices=[NODE_1])
    assert codes(findings) == ["DeviceNotInSlice"]
    assert findings[0].device == f"{DRIVER}/node-1/gpu-7"


def test_an_incomplete_pool_proves_nothing_missing():
    """``GatherPools``: an incomplete pool may hold the device in a slice not seen yet."""
    half = resource_slice(count=2, devices=gpus("gpu-0"))
    assert judged(claim("b", results=[result("gpu-7")]), slices=[half]) == []


def test_a_device_only_in_an_older_generation_is_not_in_the_pool():
    """``addSlice``: out-dated slices are ignored entirely."""
    old = resource_slice("old", generation=1, devices=gpus("gpu-0", "gpu-7"))
    new = resource_slice("new", generation=2, devices=gpus("gpu-0"))
    assert codes(judged(claim("b", results=[result("gpu-7")]), slices=[old, new])) == ["DeviceNotInSlice"]
    assert codes(judged(claim("b", results=[result("gpu-7")]), slices=[new, old])) == ["DeviceNotInSlice"]


def test_an_invalid_pool_proves_nothing_missing():
    """``buildPool`` → ``validateDeviceNames``: duplicate names make the pool invalid."""
    a = resource_slice("a", count=2, devices=gpus("gpu-0"))
    b = resource_slice("b", count=2, devices=gpus("gpu-0"))
    index = index_of(slices=[a, b])
    assert index.invalid_reason(index.pool(DRIVER, "node-1")) == "duplicate device name gpu-0"
    assert judge_allocation(claim("x", results=[result("gpu-7")]), index) == []


def test_open_question_1_a_pool_without_any_slice_is_not_judged_missing():
    """Open question 1: no slice of the pool at all is informer lag or a bogus name; the caller
    gets ``missing_pools`` to warn about."""
    new = claim("b", results=[result("gpu-0", pool="node-9")])
    index = index_of(slices=[NODE_1])
    assert judge_allocation(new, index) == []
    assert missing_pools(new, index) == [(DRIVER, "node-9")]


# --- §5.5 counters -----------------------------------------------------------------------------------


def partitioned(*, layout: str = "1.35", memory: str = "40Gi") -> list[dict]:
    """gpu-0 (whole, 40Gi) and 4 partitions of 10Gi on counter set gpu-0-counters; gpu-1 likewise."""
    devices = []
    for gpu in ("gpu-0", "gpu-1"):
        counters = f"{gpu}-counters"
        devices.append(device(gpu, consumes={counters: {"memory": memory}}))
        devices += [device(f"{gpu}-part-{i}", consumes={counters: {"memory": "10Gi"}}) for i in range(4)]
    sets = {"gpu-0-counters": {"memory": memory}, "gpu-1-counters": {"memory": memory}}
    if layout == "1.34":
        return [resource_slice(devices=devices, counters=sets)]
    return [
        resource_slice("counters", count=2, counters=sets, node_name="node-1"),
        resource_slice("devices", count=2, devices=devices),
    ]


def test_partitions_within_their_counters_fit():
    """``allocator_experimental.go: checkAvailableCounters``: consumed ≤ available."""
    holders = [claim("a", results=[result("gpu-0-part-0"), result("gpu-0-part-1")])]
    new = claim("b", requests=[request(count=2)], results=[result("gpu-0-part-2"), result("gpu-0-part-3")])
    assert judged(new, slices=partitioned(), claims=holders) == []


def test_a_whole_gpu_and_its_partition_conflict_only_through_counters():
    """``checkAvailableCounters``: the full GPU and a partition are different devices; the
    counter set they share is what they both take."""
    findings = judged(
        claim("b", results=[result("gpu-0")]),
        slices=partitioned(),
        claims=[claim("a", results=[result("gpu-0-part-3")])],
    )
    assert codes(findings) == ["DeviceCountersExceeded"]
    assert findings[0].device == f"{DRIVER}/node-1/gpu-0"
    assert [str(h) for h in findings[0].holders] == ["default/a"]
    assert "gpu-0-counters/memory" in findings[0].message


def test_counter_sets_are_independent():
    """``checkAvailableCounters`` sums per counter set: gpu-1's partitions never touch gpu-0's."""
    holders = [claim("a", results=[result("gpu-1")])]
    assert judged(claim("b", results=[result("gpu-0")]), slices=partitioned(), claims=holders) == []


def test_partitions_of_one_allocation_add_up():
    """``consumedCounters``: all results of the new allocation in one pool add up."""
    new = claim("b", requests=[request(count=2)], results=[result("gpu-0"), result("gpu-0-part-0")])
    findings = judged(new, slices=partitioned())
    assert codes(findings) == ["DeviceCountersExceeded"] * 2
    assert [f.device.rsplit("/", 1)[1] for f in findings] == ["gpu-0", "gpu-0-part-0"]


def test_open_question_2_shares_and_admin_access_take_no_counters():
    """Open question 2, following upstream: ``checkAvailableCounters`` subtracts only devices in
    ``AllocatedDevices``; admin access and shares are not in it."""
    monitor = claim("m", requests=[request(adminAccess=True)], results=[result("gpu-0-part-0", admin=True)])
    shared = claim("s", results=[result("gpu-0-part-1", share_id="s-1")])
    assert judged(claim("b", results=[result("gpu-0")]), slices=partitioned(), claims=[monitor, shared]) == []
    admin_whole = claim("m2", requests=[request(adminAccess=True)], results=[result("gpu-0", admin=True)])
    assert (
        judged(admin_whole, slices=partitioned(), claims=[claim("a", results=[result("gpu-0-part-0")])]) == []
    )


def test_a_shared_device_already_in_use_skips_the_counter_check():
    """``allocateDevice``: ``skipCounterCheck := allowMultipleAllocations && deviceCapacityInUse``."""
    sets = {"c": {"memory": "10Gi"}}
    pieces = [
        resource_slice("counters", count=2, counters=sets),
        resource_slice(
            "devices",
            count=2,
            devices=[
                device("vgpu", multi=True, capacity={"cores": "100"}, consumes={"c": {"memory": "10Gi"}}),
                device("part", consumes={"c": {"memory": "10Gi"}}),
            ],
        ),
    ]
    cores = [request(capacity={"requests": {"cores": "10"}})]
    first = claim("a", requests=cores, results=[result("vgpu", share_id="s-a", consumed={"cores": "10"})])
    second = claim("b", requests=cores, results=[result("vgpu", share_id="s-b", consumed={"cores": "10"})])
    holder = claim("p", results=[result("part")])
    assert judged(second, slices=pieces, claims=[first, holder]) == []
    assert codes(judged(second, slices=pieces, claims=[holder])) == ["DeviceCountersExceeded"]


def test_the_1_34_layout_counts_counters_of_device_slices():
    """Spec §1 layout note: in 1.34 a slice carried sharedCounters and devices together; the
    counters are the pool's as long as set names are unique."""
    findings = judged(
        claim("b", results=[result("gpu-0")]),
        slices=partitioned(layout="1.34"),
        claims=[claim("a", results=[result("gpu-0-part-0")])],
    )
    assert codes(findings) == ["DeviceCountersExceeded"]


def test_open_question_4_a_counter_set_name_repeated_across_1_34_slices_is_per_slice():
    """Open question 4: the 1.34 allocator keyed ``availableCounters`` by slice name."""
    pieces = [
        resource_slice(
            f"s{i}",
            count=2,
            counters={"gpu": {"memory": "10Gi"}},
            devices=[device(f"d{i}", consumes={"gpu": {"memory": "10Gi"}})],
        )
        for i in (0, 1)
    ]
    index = index_of(slices=pieces)
    assert index.invalid_reason(index.pool(DRIVER, "node-1")) == ""
    assert judge_allocation(claim("b", results=[result("d1")]), index) == []
    index.set_claim(claim("a", results=[result("d0")]))
    assert judge_allocation(claim("b", results=[result("d1")]), index) == []


def test_in_flight_exclusive_devices_take_their_counters():
    """``claimTracker.ListAllAllocatedDevices``: in-flight devices are in the allocated set the
    counters are computed from."""
    findings = judged(
        claim("b", results=[result("gpu-0")]),
        slices=partitioned(),
        in_flight=[claim("a", results=[result("gpu-0-part-0")])],
    )
    assert codes(findings) == ["DeviceCountersExceeded"]


# --- §5.6 taints -------------------------------------------------------------------------------------


def tainted(effect: str) -> dict:
    return resource_slice(
        devices=[device("gpu-0", taints=[{"key": "health", "value": "bad", "effect": effect}])]
    )


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_an_untolerated_taint_prevents_allocation(effect):
    """``allocator_experimental.go: taintPreventsAllocation``: NoSchedule and NoExecute."""
    findings = judged(claim("b", results=[result("gpu-0")]), slices=[tainted(effect)])
    assert codes(findings) == ["DeviceTaintNotTolerated"]
    assert f"health=bad:{effect}" in findings[0].message


@pytest.mark.parametrize("effect", ["None", "SomethingNew"])
def test_only_known_effects_prevent_allocation(effect):
    """``taintPreventsAllocation``: "Only known effects prevent allocation, others (including None)
    are ignored"."""
    assert judged(claim("b", results=[result("gpu-0")]), slices=[tainted(effect)]) == []


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "health", "operator": "Equal", "value": "bad"}, True),
        ({"key": "health", "value": "bad", "effect": "NoSchedule"}, True),
        ({"key": "health", "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),
        ({"key": "health", "value": "good"}, False),
        ({"key": "other", "operator": "Exists"}, False),
        ({"key": "health", "operator": "Exists", "effect": "NoExecute"}, False),
    ],
)
def test_tolerations_of_the_request_match_like_pod_tolerations(toleration, tolerated):
    """``resourceclaim/devicetoleration.go: ToleratesTaint`` (via ``taintTolerated``)."""
    new = claim("b", requests=[request(tolerations=[toleration])], results=[result("gpu-0")])
    assert (judged(new, slices=[tainted("NoSchedule")]) == []) is tolerated


def test_a_subrequest_uses_its_own_tolerations():
    """``deviceSubRequestAccessor.tolerations``: a ``<req>/<sub>`` result is judged with the
    chosen subrequest's tolerations."""
    requests = [
        {
            "name": "gpu",
            "firstAvailable": [
                {"name": "big", "deviceClassName": "c"},
                {"name": "any", "deviceClassName": "c", "tolerations": [{"operator": "Exists"}]},
            ],
        }
    ]
    ok = claim("b", requests=requests, results=[result("gpu-0", req="gpu/any")])
    bad = claim("b", requests=requests, results=[result("gpu-0", req="gpu/big")])
    assert judged(ok, slices=[tainted("NoExecute")]) == []
    assert codes(judged(bad, slices=[tainted("NoExecute")])) == ["DeviceTaintNotTolerated"]


def test_the_results_own_toleration_copy_is_not_trusted():
    """Spec §5.6: tolerations are the request's; a status write cannot change the spec, so a
    toleration only in the result does not count."""
    new = claim("b", results=[result("gpu-0", tolerations=[{"operator": "Exists"}])])
    assert codes(judged(new, slices=[tainted("NoSchedule")])) == ["DeviceTaintNotTolerated"]


def test_admin_access_must_tolerate_taints_too():
    """``allocateDevice``: the taint check is outside the in-use branch, admin access included."""
    new = claim("m", requests=[request(adminAccess=True)], results=[result("gpu-0", admin=True)])
    assert codes(judged(new, slices=[tainted("NoSchedule")])) == ["DeviceTaintNotTolerated"]


def test_device_taint_rules_taint_the_devices_they_select():
    """``resourceslice/tracker: ListPatchedResourceSlices`` merges DeviceTaintRule taints."""
    rule = {
        "metadata": {"name": "drain-node-1"},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": "node-1"},
            "taint": {"key": "drain", "effect": "NoSchedule"},
        },
    }
    other_pool = copy.deepcopy(rule)
    other_pool["spec"]["deviceSelector"]["pool"] = "node-2"
    no_selector = {"metadata": {"name": "x"}, "spec": {"taint": {"key": "drain", "effect": "NoSchedule"}}}
    new = claim("b", results=[result("gpu-0")])
    assert codes(judged(new, slices=[NODE_1], rules=[rule])) == ["DeviceTaintNotTolerated"]
    assert judged(new, slices=[NODE_1], rules=[other_pool, no_selector]) == []


def test_device_lookups_use_the_current_generation():
    """Spec §5.4: taints (and every device property) come from the pool's highest generation."""
    old = resource_slice("s", generation=1, devices=gpus("gpu-0"))
    new = resource_slice(
        "s", generation=2, devices=[device("gpu-0", taints=[{"key": "k", "effect": "NoSchedule"}])]
    )
    index = index_of(slices=[old])
    assert judge_allocation(claim("b", results=[result("gpu-0")]), index) == []
    index.set_slice(new)
    assert codes(judge_allocation(claim("b", results=[result("gpu-0")]), index)) == [
        "DeviceTaintNotTolerated"
    ]


# --- §5.7 node selection -----------------------------------------------------------------------------


def test_network_attached_devices_are_exclusive_across_nodes():
    """``allocateddevices.go``: the in-use set is global; ``GatherPools`` only decides which
    slices a node sees, not who holds a device."""
    fabric = resource_slice("fabric", pool="fabric", allNodes=True, devices=gpus("link-0"))
    on_a = claim("a", results=[result("link-0", pool="fabric")], node=None)
    on_b = claim("b", results=[result("link-0", pool="fabric")], node="node-2")
    assert codes(judged(on_b, slices=[fabric], claims=[on_a])) == ["DeviceAlreadyAllocated"]


def test_an_allocation_pinned_to_another_node_is_not_a_finding():
    """``createNodeSelector``: the node selector is derived, and nothing upstream validates it
    against the slice's node; it is no double allocation."""
    assert judged(claim("b", results=[result("gpu-0")], node="node-2"), slices=[NODE_1]) == []


# --- §5.9 evaluation order ---------------------------------------------------------------------------


def test_every_result_is_evaluated_and_each_reason_reported_once_in_order():
    """Spec §5.9: all results are judged; reasons come once each, in the spec's order."""
    pieces = [*partitioned(), tainted("NoSchedule") | {"metadata": {"name": "t"}}]
    pieces[-1]["spec"]["pool"]["name"] = "node-t"
    holders = [claim("a", results=[result("gpu-1"), result("gpu-0-part-0")])]
    new = claim(
        "b",
        requests=[request(count=5)],
        results=[
            result("gpu-0", pool="node-t"),
            result("nope"),
            result("gpu-0"),
            result("gpu-1"),
            result("gpu-1-part-0"),
        ],
    )
    findings = judged(new, slices=pieces, claims=holders)
    assert reasons(findings) == [
        "DeviceAlreadyAllocated",
        "DeviceCountersExceeded",
        "DeviceTaintNotTolerated",
        "DeviceNotInSlice",
    ]
    assert set(reasons(findings)) <= set(REASONS)
    assert {f.device.rsplit("/", 2)[-2] + "/" + f.device.rsplit("/", 1)[-1] for f in findings} == {
        "node-1/gpu-1",
        "node-1/gpu-0",
        "node-1/gpu-1-part-0",
        "node-t/gpu-0",
        "node-1/nope",
    }


def test_an_indexed_allocation_can_be_audited_against_the_others():
    """Audit: each of two claims already holding one device finds the other."""
    index = index_of(
        slices=[NODE_1], claims=[claim("a", results=[result("gpu-0")]), claim("b", results=[result("gpu-0")])]
    )
    for key, other in (("uid-default-a", "default/b"), ("uid-default-b", "default/a")):
        findings = judge_allocation(index.claim(key), index)
        assert [(f.reason, [str(h) for h in f.holders]) for f in findings] == [
            ("DeviceAlreadyAllocated", [other])
        ]


# --- readers -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (
            lambda s: s["spec"]["devices"][0]["capacity"].update(memory={"value": "lots"}),
            "spec.devices[0].capacity.memory.value",
        ),
        (lambda s: s["spec"].update(devices="gpu-0"), "spec.devices"),
        (lambda s: s["spec"]["pool"].update(resourceSliceCount=0), "spec.pool.resourceSliceCount"),
        (lambda s: s["spec"].pop("driver"), "spec.driver"),
        (
            lambda s: s["spec"]["devices"][0].update(allowMultipleAllocations="yes"),
            "spec.devices[0].allowMultipleAllocations",
        ),
    ],
)
def test_a_malformed_slice_field_is_a_field_error_naming_it(mutate, field):
    obj = resource_slice(devices=[device("gpu-0", capacity={"memory": "40Gi"})])
    mutate(obj)
    with pytest.raises(FieldError) as err:
        resource_slice_from(obj)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (
            lambda r: r.update(consumedCapacity={"memory": "-1"}),
            "status.allocation.devices.results[0].consumedCapacity.memory",
        ),
        (lambda r: r.pop("device"), "status.allocation.devices.results[0].device"),
        (lambda r: r.update(adminAccess="true"), "status.allocation.devices.results[0].adminAccess"),
        (lambda r: r.update(tolerations={"key": "x"}), "status.allocation.devices.results[0].tolerations"),
    ],
)
def test_a_malformed_claim_field_is_a_field_error_naming_it(mutate, field):
    obj = claim("a", results=[result("gpu-0")])
    mutate(obj["status"]["allocation"]["devices"]["results"][0])
    with pytest.raises(FieldError) as err:
        resource_claim_from(obj)
    assert err.value.field == field


def test_quantities_are_exact_nano_units():
    """apimachinery keeps quantities at nano scale: three 1/3-ish shares never round to fit."""
    piece = resource_slice_from(
        resource_slice(devices=[device("d", capacity={"a": "1.5", "b": "40Gi", "c": "1n"})])
    )
    assert piece.devices[0].capacity == (
        ("a", Capacity(1_500_000_000)),
        ("b", Capacity(40 * GI)),
        ("c", Capacity(1)),
    )


def test_equal_devices_of_different_nodes_share_one_record():
    """Memory: attributes are not kept, so gpu-0 of every node is one object."""
    a = resource_slice_from(resource_slice("a", pool="n1", devices=gpus("gpu-0")))
    b = resource_slice_from(resource_slice("b", pool="n2", devices=gpus("gpu-0")))
    assert a.devices[0] is b.devices[0]


def test_device_tolerations_and_taints_read():
    parsed = resource_claim_from(
        claim(
            "a", requests=[request(tolerations=[{"key": "k", "operator": "Exists", "effect": "NoSchedule"}])]
        )
    )
    toleration = parsed.request("gpu").tolerations[0]
    assert toleration.tolerates(Taint("k", "v", "NoSchedule"))
    assert not toleration.tolerates(Taint("k", "v", "NoExecute"))


def test_the_allocation_node_selector_says_which_nodes_can_use_the_devices():
    """``createNodeSelector``: ``matchFields metadata.name In [node]`` for node-local devices;
    equal selectors of one node's claims are one object."""
    a = resource_claim_from(claim("a", results=[result("gpu-0")], node="node-1")).allocation
    b = resource_claim_from(claim("b", results=[result("gpu-1")], node="node-1")).allocation
    assert a.node_selector is b.node_selector
    assert a.node_selector.matches({}, "node-1")
    assert not a.node_selector.matches({}, "node-2")
    assert (
        resource_claim_from(claim("c", results=[result("gpu-0")], node=None)).allocation.node_selector is None
    )


def test_device_classes_and_extended_resource_names_are_read():
    index = DeviceIndex()
    index.set_device_class({"metadata": {"name": "gpu"}, "spec": {"extendedResourceName": "example.com/gpu"}})
    assert index.device_class("gpu").extended_resource_name == "example.com/gpu"
    index.remove_device_class("gpu")
    assert index.device_class("gpu") is None


@pytest.mark.parametrize(
    ("nano", "text"), [(40 * GI, "40Gi"), (10**10 * NANO, "10G"), (7 * NANO, "7"), (1_500_000_000, "1.5")]
)
def test_amounts_in_messages_read_like_quantities(nano, text):
    assert format_nano(nano) == text


# --- the index ---------------------------------------------------------------------------------------


def state(index: DeviceIndex):
    return (
        dict(index.uses()),
        dict(index.claims()),
        {k: (p.generation, p.slices, dict(p.devices)) for k, p in index.pools().items()},
    )


def test_applying_then_removing_a_claim_restores_the_index_exactly():
    index = index_of(
        slices=[NODE_1, NIC | {"metadata": {"name": "nic"}}],
        claims=[claim("a", results=[result("gpu-0")]), share_claim("s", "1G")],
    )
    before = state(index)
    index.set_claim(claim("b", results=[result("gpu-0"), result("gpu-1")]))
    index.set_claim(share_claim("t", "2G"))
    assert state(index) != before
    index.remove_claim("uid-default-b")
    index.set_claim(claim("t"))
    assert state(index) == before


def test_a_reserved_for_change_keeps_the_devices_held():
    index = index_of(claims=[claim("a", results=[result("gpu-0")])])
    uses = dict(index.uses())
    index.set_claim(claim("a", results=[result("gpu-0")], reserved_for=["p"]))
    assert dict(index.uses()) == uses
    assert [r.name for r in index.claim("uid-default-a").reserved_for] == ["p"]


def test_a_generation_bump_replaces_the_pools_devices():
    """``addSlice``: a newer generation replaces all old slices' devices."""
    index = index_of(
        slices=[
            resource_slice("s1", generation=1, count=2, devices=gpus("gpu-0")),
            resource_slice("s2", generation=1, count=2, devices=gpus("gpu-1")),
        ]
    )
    pool = index.pool(DRIVER, "node-1")
    assert (pool.generation, sorted(pool.devices), pool.complete) == (1, ["gpu-0", "gpu-1"], True)
    index.set_slice(resource_slice("s1", generation=2, count=1, devices=gpus("gpu-2")))
    pool = index.pool(DRIVER, "node-1")
    assert (pool.generation, sorted(pool.devices), pool.complete) == (2, ["gpu-2"], True)
    index.remove_slice("s2")  # the driver deletes the out-dated slice: nothing changes
    assert sorted(index.pool(DRIVER, "node-1").devices) == ["gpu-2"]
    index.remove_slice("s1")
    assert index.pool(DRIVER, "node-1") is None


def test_removing_the_newest_slice_falls_back_to_the_highest_generation_left():
    """``GatherPools``: the current generation is the highest among the slices that exist."""
    index = index_of(
        slices=[
            resource_slice("old", generation=1, devices=gpus("a")),
            resource_slice("new", generation=2, devices=gpus("b")),
        ]
    )
    index.remove_slice("new")
    assert sorted(index.pool(DRIVER, "node-1").devices) == ["a"]


slice_events = st.lists(
    st.tuples(
        st.sampled_from(["s1", "s2", "s3"]),
        st.integers(1, 3),
        st.integers(1, 2),
        st.sets(st.sampled_from("abcd")),
        st.booleans(),
    ),
    max_size=12,
)


@given(slice_events)
@settings(max_examples=60, deadline=None)
def test_incremental_pools_equal_pools_built_from_scratch(events):
    """Whatever the order of slice events, the pool is what a fresh build of the final slices gives."""
    index = DeviceIndex()
    final = {}
    for name, generation, count, names, remove in events:
        if remove:
            index.remove_slice(name)
            final.pop(name, None)
        else:
            obj = resource_slice(name, generation=generation, count=count, devices=gpus(*sorted(names)))
            index.set_slice(obj)
            final[name] = obj
    fresh = index_of(slices=[final[n] for n in sorted(final)])

    def view(i):
        return {
            k: (p.generation, sorted(p.slices), sorted(p.devices), p.complete) for k, p in i.pools().items()
        }

    assert view(index) == view(fresh)


claim_events = st.lists(
    st.tuples(st.integers(0, 4), st.sets(st.sampled_from(["gpu-0", "gpu-1", "gpu-2"])), st.booleans()),
    max_size=15,
)


@given(claim_events)
@settings(max_examples=60, deadline=None)
def test_incremental_uses_equal_uses_built_from_scratch(events):
    """Claim events in any order leave exactly the uses of the claims that end allocated."""
    index = DeviceIndex()
    final = {}
    for i, devices, deallocate in events:
        obj = claim(f"c{i}", results=None if deallocate else [result(d) for d in sorted(devices)])
        index.set_claim(obj)
        final[i] = obj
    fresh = index_of(claims=[final[i] for i in sorted(final)])
    assert {k: sorted(v.exclusive) for k, v in index.uses().items()} == {
        k: sorted(v.exclusive) for k, v in fresh.uses().items()
    }
    assert dict(index.claims()) == dict(fresh.claims())


# --- arithmetic properties ---------------------------------------------------------------------------

amounts = st.lists(st.integers(0, 12), max_size=5)


@given(amounts, amounts, st.randoms(use_true_random=False))
@settings(max_examples=80, deadline=None)
def test_shares_never_exceed_the_capacity_and_order_does_not_matter(others, ours, rnd):
    """``CmpRequestOverCapacity``: allowed iff every share together fits, however the results
    are ordered and whether other shares are indexed or in flight."""
    holders = [share_claim(f"o{i}", f"{a}G") for i, a in enumerate(others)]
    results = [
        result("nic-0", req=f"r{i}", share_id=f"s{i}", consumed={"bandwidth": f"{a}G"})
        for i, a in enumerate(ours)
    ]
    requests = [request(f"r{i}", capacity={"requests": {"bandwidth": f"{a}G"}}) for i, a in enumerate(ours)]
    fits = sum(others) + sum(ours) <= 10 or not ours
    verdicts = set()
    for _ in range(3):
        rnd.shuffle(results)
        rnd.shuffle(holders)
        split = rnd.randint(0, len(holders))
        new = claim("new", requests=requests, results=results)
        found = judged(new, slices=[NIC], claims=holders[:split], in_flight=holders[split:])
        verdicts.add(tuple(reasons(found)))
    assert verdicts == {() if fits else ("DeviceCapacityExceeded",)}


@given(st.lists(st.integers(0, 2), min_size=4, max_size=4), st.randoms(use_true_random=False))
@settings(max_examples=80, deadline=None)
def test_counters_never_exceed_the_set_and_order_does_not_matter(owners, rnd):
    """``checkAvailableCounters``: partition i held by others (1), wanted (2) or free (0);
    allowed iff all held and wanted partitions fit the 30Gi set, in any order."""
    pieces = partitioned(memory="30Gi")
    held = [f"gpu-0-part-{i}" for i, o in enumerate(owners) if o == 1]
    wanted = [f"gpu-0-part-{i}" for i, o in enumerate(owners) if o == 2]
    holders = [claim(f"h{i}", results=[result(d)]) for i, d in enumerate(held)]
    fits = 10 * (len(held) + len(wanted)) <= 30 or not wanted
    verdicts = set()
    for _ in range(3):
        rnd.shuffle(wanted)
        rnd.shuffle(holders)
        split = rnd.randint(0, len(holders))
        new = claim("new", requests=[request(count=len(wanted))], results=[result(d) for d in wanted])
        verdicts.add(
            tuple(reasons(judged(new, slices=pieces, claims=holders[:split], in_flight=holders[split:])))
        )
    assert verdicts == {() if fits else ("DeviceCountersExceeded",)}


def test_a_random_cluster_judges_the_same_after_an_event_replay():
    """Replaying the same events in another order gives the same verdicts (no hidden order)."""
    rnd = random.Random(7)
    objects = [claim(f"c{i}", results=[result(f"gpu-{rnd.randint(0, 1)}")]) for i in range(6)]
    a = index_of(slices=[NODE_1], claims=objects)
    b = index_of(slices=[NODE_1], claims=list(reversed(objects)))
    new = claim("new", results=[result("gpu-0"), result("gpu-1")])
    assert {(f.reason, f.device, frozenset(map(str, f.holders))) for f in judge_allocation(new, a)} == {
        (f.reason, f.device, frozenset(map(str, f.holders))) for f in judge_allocation(new, b)
    }
