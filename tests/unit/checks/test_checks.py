"""Kubelet-equivalent predicates: reason codes, exact messages, and order (kubelet-admission-spec §3-§10)."""

import pytest

from tests.helpers.builders import container, node, pod
from webhook.checks import PodUnderReview, kubelet_admission
from webhook.kube.workloads import pod_shape
from webhook.state import ClusterState, node_from, pod_record


def cluster(node_obj, *pods):
    state = ClusterState()
    state.set_node(node_from(node_obj))
    for p in pods:
        record = pod_record(p)
        state.set_pod(record.key if record else p["metadata"]["uid"], record)
    return state


def admit(pod_obj, state, node_name="node-1"):
    review = PodUnderReview.from_shape(pod_shape(pod_obj))
    return kubelet_admission(review, state.nodes[node_name], state.usage(node_name))


def reasons(failures):
    return [f.reason for f in failures]


def test_pod_count_is_checked_even_for_pods_without_requests():
    state = cluster(node(pods="2"), pod("a", node_name="node-1"), pod("b", node_name="node-1"))
    [failure] = admit(pod("new", node_name="node-1"), state)
    assert failure.reason == "OutOfpods"
    assert failure.message == "Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2"


def test_cpu_shortage_message_uses_millicores_and_allocatable():
    state = cluster(node(cpu="4"), pod("a", node_name="node-1", requests={"cpu": "3500m"}))
    [failure] = admit(pod("new", node_name="node-1", requests={"cpu": "1"}), state)
    assert failure.reason == "OutOfcpu"
    assert (
        failure.message
        == "Node didn't have enough resource: cpu, requested: 1000, used: 3500, capacity: 4000"
    )


def test_exactly_full_fits():
    state = cluster(node(cpu="4"), pod("a", node_name="node-1", requests={"cpu": "3"}))
    assert admit(pod("new", node_name="node-1", requests={"cpu": "1"}), state) == []


def test_unrequested_resource_is_not_checked_on_an_overcommitted_node():
    state = cluster(node(memory="1Gi"), pod("a", node_name="node-1", requests={"memory": "2Gi"}))
    assert admit(pod("new", node_name="node-1", requests={"cpu": "100m"}), state) == []


def test_device_shortage_is_out_of_the_resource():
    state = cluster(
        node(extra={"nvidia.com/gpu": "8"}), pod("a", node_name="node-1", requests={"nvidia.com/gpu": "8"})
    )
    [failure] = admit(pod("new", node_name="node-1", requests={"nvidia.com/gpu": "1"}), state)
    assert failure.reason == "OutOfnvidia.com/gpu"
    assert failure.summary() == "OutOfnvidia.com/gpu (requested 1, 8 of 8 in use)"


def test_extended_resources_the_node_does_not_report_are_dropped():
    state = cluster(node())
    assert admit(pod("new", node_name="node-1", requests={"example.com/license": "3"}), state) == []


def test_extended_resource_reported_as_zero_is_kept_and_fails():
    state = cluster(node(extra={"example.com/foo": "0"}))
    assert reasons(admit(pod("new", node_name="node-1", requests={"example.com/foo": "1"}), state)) == [
        "OutOfexample.com/foo"
    ]


def test_missing_hugepages_are_not_dropped():
    state = cluster(node())
    assert reasons(admit(pod("new", node_name="node-1", requests={"hugepages-2Mi": "2Mi"}), state)) == [
        "OutOfhugepages-2Mi"
    ]


def test_zero_scalar_requests_are_skipped():
    state = cluster(node(extra={"example.com/foo": "0"}))
    assert admit(pod("new", node_name="node-1", requests={"example.com/foo": "0"}), state) == []


def test_terminal_pods_hold_nothing():
    state = cluster(node(pods="1"), pod("done", node_name="node-1", phase="Succeeded"))
    assert admit(pod("new", node_name="node-1"), state) == []


def test_the_incoming_pod_never_counts_against_itself():
    existing = pod("same", node_name="node-1", requests={"cpu": "4"})
    state = cluster(node(cpu="4", pods="1"), existing)
    assert admit(existing, state) == []


def test_all_failures_are_reported_in_kubelet_order():
    state = cluster(
        node(cpu="1", pods="1", taints=[{"key": "k", "value": "v", "effect": "NoExecute"}]),
        pod(
            "a",
            node_name="node-1",
            requests={"cpu": "1"},
            containers=[container(requests={"cpu": "1"}, ports=[{"containerPort": 80, "hostPort": 80}])],
        ),
    )
    incoming = pod(
        "new",
        node_name="node-1",
        nodeSelector={"disk": "ssd"},
        containers=[
            container(requests={"cpu": "1", "memory": "1Gi"}, ports=[{"containerPort": 80, "hostPort": 80}])
        ],
    )
    assert reasons(admit(incoming, state)) == [
        "OutOfpods",
        "OutOfcpu",
        "NodeAffinity",
        "NodePorts",
        "TaintToleration",
    ]


@pytest.mark.parametrize(
    ("expression", "matches"),
    [
        ({"key": "zone", "operator": "In", "values": ["a", "b"]}, True),
        ({"key": "zone", "operator": "NotIn", "values": ["a"]}, False),
        ({"key": "missing", "operator": "NotIn", "values": ["a"]}, True),
        ({"key": "zone", "operator": "Exists"}, True),
        ({"key": "zone", "operator": "DoesNotExist"}, False),
        ({"key": "gen", "operator": "Gt", "values": ["0204"]}, True),  # 0206 > 0204
        ({"key": "gen", "operator": "Lt", "values": ["206"]}, False),  # strict
        ({"key": "zone", "operator": "Gt", "values": ["1"]}, False),  # unparsable label
        ({"key": "zone", "operator": "Bogus", "values": ["a"]}, False),
        ({"key": "zone", "operator": "Exists", "values": ["a"]}, False),  # malformed term
    ],
)
def test_node_affinity_operators(expression, matches):
    state = cluster(node(labels={"zone": "a", "gen": "0206"}))
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [expression]}]
            }
        }
    }
    failures = admit(pod("new", node_name="node-1", affinity=affinity), state)
    assert (failures == []) is matches


@pytest.mark.parametrize(
    ("fields", "matches"),
    [
        ([{"key": "metadata.name", "operator": "In", "values": ["node-1"]}], True),
        ([{"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}], False),
        ([{"key": "metadata.name", "operator": "In", "values": ["node-1", "node-2"]}], False),
        ([{"key": "metadata.uid", "operator": "In", "values": ["node-1"]}], False),
    ],
)
def test_match_fields_allow_only_metadata_name_with_one_value(fields, matches):
    state = cluster(node())
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": fields}]}
        }
    }
    assert (admit(pod("new", node_name="node-1", affinity=affinity), state) == []) is matches


def test_terms_are_ored_and_empty_terms_never_match():
    state = cluster(node(labels={"zone": "a"}))
    only_empty = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}]}}
    }
    assert reasons(admit(pod("new", node_name="node-1", affinity=only_empty), state)) == ["NodeAffinity"]
    either = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                ]
            }
        }
    }
    assert admit(pod("new", node_name="node-1", affinity=either), state) == []


def test_node_selector_and_affinity_must_both_match():
    state = cluster(node(labels={"zone": "a"}))
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Exists"}]}]
            }
        }
    }
    failures = admit(pod("new", node_name="node-1", nodeSelector={"zone": "b"}, affinity=affinity), state)
    assert (
        failures[0].message
        == "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
    )


def port(host_port, host_ip=None, protocol=None):
    entry = {"containerPort": host_port, "hostPort": host_port}
    if host_ip:
        entry["hostIP"] = host_ip
    if protocol:
        entry["protocol"] = protocol
    return entry


@pytest.mark.parametrize(
    ("used", "wanted", "conflict"),
    [
        (port(80), port(80), True),
        (port(80, "10.0.0.1"), port(80), True),  # wildcard wants every IP
        (port(80), port(80, "10.0.0.1"), True),  # a specific IP conflicts with the wildcard
        (port(80, "10.0.0.1"), port(80, "10.0.0.2"), False),
        (port(80, protocol="UDP"), port(80), False),
        (port(80), port(81), False),
    ],
)
def test_host_port_conflicts(used, wanted, conflict):
    state = cluster(node(), pod("a", node_name="node-1", containers=[container(ports=[used])]))
    failures = admit(pod("new", node_name="node-1", containers=[container(ports=[wanted])]), state)
    assert (reasons(failures) == ["NodePorts"]) is conflict


def test_sidecar_host_ports_count_and_regular_init_ports_do_not():
    existing = pod(
        "a",
        node_name="node-1",
        initContainers=[
            container("sidecar", restartPolicy="Always", ports=[port(9000)]),
            container("init", ports=[port(9001)]),
        ],
    )
    state = cluster(node(), existing)
    assert reasons(
        admit(pod("n1", node_name="node-1", containers=[container(ports=[port(9000)])]), state)
    ) == ["NodePorts"]
    assert admit(pod("n2", node_name="node-1", containers=[container(ports=[port(9001)])]), state) == []


def test_only_no_execute_taints_reject():
    state = cluster(node(taints=[{"key": "gpu", "effect": "NoSchedule"}]))
    assert admit(pod("new", node_name="node-1"), state) == []
    state = cluster(node(taints=[{"key": "dedicated", "value": "infra", "effect": "NoExecute"}]))
    assert reasons(admit(pod("new", node_name="node-1"), state)) == ["TaintToleration"]
    tolerated = pod(
        "new", node_name="node-1", tolerations=[{"key": "dedicated", "operator": "Equal", "value": "infra"}]
    )
    assert admit(tolerated, state) == []
    wrong_value = pod("new", node_name="node-1", tolerations=[{"key": "dedicated", "value": "batch"}])
    assert reasons(admit(wrong_value, state)) == ["TaintToleration"]
    assert admit(pod("new", node_name="node-1", tolerations=[{"operator": "Exists"}]), state) == []


def test_disk_pressure_rejects_every_non_critical_pod():
    state = cluster(node(conditions=["DiskPressure"]))
    [failure] = admit(pod("new", node_name="node-1", requests={"cpu": "1"}), state)
    assert (failure.reason, failure.message) == ("Evicted", "The node had condition: [DiskPressure]. ")


def test_memory_pressure_alone_rejects_only_best_effort_pods():
    state = cluster(node(conditions=["MemoryPressure"]))
    assert admit(pod("burstable", node_name="node-1", requests={"memory": "1Gi"}), state) == []
    assert reasons(admit(pod("besteffort", node_name="node-1"), state)) == ["Evicted"]
    tolerant = pod(
        "tolerant",
        node_name="node-1",
        tolerations=[{"key": "node.kubernetes.io/memory-pressure", "operator": "Exists"}],
    )
    assert admit(tolerant, state) == []


def test_critical_pods_pass_the_eviction_manager():
    state = cluster(node(conditions=["DiskPressure", "MemoryPressure"]))
    assert admit(pod("critical", node_name="node-1", priority=2000001000), state) == []


def test_os_label_and_os_field_must_match_the_node():
    state = cluster(node(os="linux"))
    labelled = pod("win", node_name="node-1")
    labelled["metadata"]["labels"] = {"kubernetes.io/os": "windows"}
    assert reasons(admit(labelled, state)) == ["PodOSSelectorNodeLabelDoesNotMatch"]
    assert reasons(admit(pod("win2", node_name="node-1", os={"name": "windows"}), state)) == [
        "PodOSNotSupported"
    ]


def test_strict_supplemental_groups_need_node_support():
    state = cluster(node())
    strict = pod("s", node_name="node-1", securityContext={"supplementalGroupsPolicy": "Strict"})
    assert reasons(admit(strict, state)) == ["SupplementalGroupsPolicyNotSupported"]
    supported = node()
    supported["status"]["features"] = {"supplementalGroupsPolicy": True}
    assert admit(strict, cluster(supported)) == []


def test_critical_pod_short_only_on_resources_is_admitted_when_preemption_covers_it():
    state = cluster(
        node(cpu="2", pods="2"),
        pod("a", node_name="node-1", requests={"cpu": "1"}),
        pod("b", node_name="node-1", requests={"cpu": "1"}),
    )
    assert admit(pod("critical", node_name="node-1", requests={"cpu": "1"}, priority=2000000000), state) == []


def test_critical_pod_gets_unexpected_admission_error_when_victims_cannot_cover():
    other_critical = pod("c", node_name="node-1", requests={"cpu": "2"}, priority=2000001000)
    state = cluster(node(cpu="2"), other_critical)
    [failure] = admit(pod("critical", node_name="node-1", requests={"cpu": "1"}, priority=2000000000), state)
    assert failure.reason == "UnexpectedAdmissionError"
    assert failure.message.endswith(
        "no set of running pods found to reclaim resources: [(res: cpu, q: 1000), ]"
    )


def test_critical_pod_reports_only_non_resource_failures_when_there_are_any():
    state = cluster(
        node(cpu="1", taints=[{"key": "k", "effect": "NoExecute"}]),
        pod("a", node_name="node-1", requests={"cpu": "1"}),
    )
    failures = admit(pod("critical", node_name="node-1", requests={"cpu": "1"}, priority=2000000000), state)
    assert reasons(failures) == ["TaintToleration"]
