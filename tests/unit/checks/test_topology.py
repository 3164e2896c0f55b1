"""The topology manager's admission (TopologyAffinityError) from NodeResourceTopology: the worked
rules of topology-admission-spec §8, the rows of §4.3, the handler order of §1.1 and the config
of §6.3/§10.1. Each docstring names the upstream function the rule comes from."""

from __future__ import annotations

import pytest

from tests.helpers.builders import container, deployment, node, pod
from tests.helpers.topology_builders import guaranteed, nrt
from webhook.checks import PodUnderReview, kubelet_admission
from webhook.config import Config, ConfigError, config_from_dict
from webhook.engine import evaluate
from webhook.kube.workloads import pod_shape
from webhook.state import ClusterState, node_from, pod_record
from webhook.state.topology import topology_from

TWO_BY_16 = [{"cpu": ("16", "16", "16")}, {"cpu": ("16", "16", "16")}]


def cluster(zones, policy="single-numa-node", scope=None, **node_args) -> ClusterState:
    """One node, ``node-1``, with plenty of node-level room and an NRT of ``zones``."""
    state = ClusterState()
    state.set_node(node_from(node("node-1", cpu="256", memory="1Ti", **node_args)))
    state.set_topology("node-1", topology_from(nrt("node-1", zones, policy=policy, scope=scope)))
    return state


def burstable(cpu="6", name="app", **extra) -> dict:
    return container(name, requests={"cpu": cpu, **extra}, limits={"memory": "2Gi", **extra})


def verdict(state: ClusterState, *containers, init=(), config: Config | None = None, **spec):
    obj = pod("p", node_name="node-1", containers=list(containers), initContainers=list(init), **spec)
    review = PodUnderReview.from_shape(pod_shape(obj))
    node_obj = state.nodes["node-1"]
    kubelet = config.node_admission.kubelet_for(node_obj) if config is not None else None
    return kubelet_admission(review, node_obj, state.usage("node-1"), kubelet)


def reasons(failures) -> list[str]:
    return [f.reason for f in failures]


def refused(state, *containers, **kwargs) -> bool:
    failures = verdict(state, *containers, **kwargs)
    assert reasons(failures) in ([], ["TopologyAffinityError"])
    return bool(failures)


# -- §8 worked rules ------------------------------------------------------------------------------


def test_rule1_single_numa_node_rejects_a_cpu_request_no_zone_has_free():
    """``singleNumaNodePolicy.Merge`` / ``filterSingleNumaHints``: cpu 6 on zones with 4 and 4 free."""
    state = cluster([{"cpu": ("16", "16", "4")}, {"cpu": ("16", "16", "4")}])
    [failure] = verdict(state, guaranteed("6"))
    assert failure.reason == "TopologyAffinityError"
    assert failure.message == "Resources cannot be allocated with Topology locality"
    assert "container 'app' (cpu 6" in failure.hint
    assert "node-0: cpu 4; node-1: cpu 4" in failure.hint


@pytest.mark.parametrize(("capacity", "admitted"), [("16", False), ("4", True)])
def test_rule2_restricted_admits_the_two_zone_hint_only_when_no_zone_has_the_capacity(capacity, admitted):
    """``generateCPUTopologyHints``: the preferred width comes from capacity, not usage."""
    state = cluster([{"cpu": (capacity, capacity, "4")}] * 2, policy="restricted")
    assert refused(state, guaranteed("6")) is not admitted


@pytest.mark.parametrize(
    ("policy", "admitted"), [("single-numa-node", False), ("restricted", True), ("best-effort", True)]
)
def test_rule3_twenty_cpus_on_two_by_sixteen(policy, admitted):
    """``generateCPUTopologyHints``: cpu 20 needs both zones, which is the preferred width."""
    assert refused(cluster(TWO_BY_16, policy=policy), guaranteed("20")) is not admitted


def test_rule4_a_burstable_pod_gets_no_cpu_hints():
    """``staticPolicy.guaranteedCPUs``: 0 unless the pod is Guaranteed → no CPU hints."""
    state = cluster([{"cpu": ("16", "16", "1")}] * 2)
    assert not refused(state, burstable("12"))


def test_rule5_fractional_cpu_gets_memory_hints_only():
    """``guaranteedCPUs`` (integer cpu only) and ``memorymanager staticPolicy.GetTopologyHints``
    (Guaranteed, any cpu)."""
    zones = [{"cpu": ("16", "16", "0"), "memory": ("8Gi", "8Gi", "1Gi")}] * 2
    assert not refused(cluster(zones), guaranteed("1500m", "1Gi"))
    assert refused(cluster(zones), guaranteed("1500m", "2Gi"))


@pytest.mark.parametrize(
    ("policy", "admitted"), [("single-numa-node", False), ("restricted", False), ("best-effort", True)]
)
def test_rule6_gpu_on_one_zone_and_cpus_on_the_other(policy, admitted):
    """``mergePermutation``: no single zone is preferred by both the CPU and device providers."""
    zones = [
        {"cpu": ("16", "16", "8"), "nvidia.com/gpu": ("1", "1", "0")},
        {"cpu": ("16", "16", "0"), "nvidia.com/gpu": ("1", "1", "1")},
    ]
    state = cluster(zones, policy=policy)
    assert refused(state, guaranteed("4", **{"nvidia.com/gpu": "1"})) is not admitted


def test_rule7_device_hints_ignore_qos():
    """``devicemanager getTopologyHints``: any resource in limits, whatever the pod's QoS."""
    state = cluster([{"nvidia.com/gpu": ("2", "2", "1")}] * 2)
    assert refused(state, burstable("1", **{"nvidia.com/gpu": "2"}))


def test_rule8_restricted_rejects_cpu_needing_two_zones_with_memory_fitting_one():
    """``mergePermutation``: "Only mark preferred if all affinities are equal"."""
    zones = [{"cpu": ("8", "8", "8"), "memory": ("8Gi", "8Gi", "8Gi")}] * 2
    state = cluster(zones, policy="restricted")
    assert refused(state, guaranteed("12", "1Gi"))
    assert not refused(state, guaranteed("12", "12Gi"))


def test_rule9_pod_scope_sums_app_containers_and_sidecars_init_containers_only_by_max():
    """``staticPolicy.podGuaranteedCPUs``: max(init peaks, apps + sidecars)."""
    state = cluster([{"cpu": ("16", "16", "10")}] * 2, scope="pod")
    sidecar = {**guaranteed("3", name="proxy"), "restartPolicy": "Always"}
    assert not refused(state, guaranteed("4"), guaranteed("4", name="b"), init=[guaranteed("10", name="i")])
    assert refused(
        state, guaranteed("4"), guaranteed("4", name="b"), init=[sidecar, guaranteed("2", name="i")]
    )
    failure = verdict(state, guaranteed("4"), guaranteed("4", name="b"), init=[sidecar])[0]
    assert "the pod (cpu 11" in failure.hint


def test_rule10_container_scope_consumes_zone_by_zone_where_pod_scope_fails_at_once():
    """``containerScope.Admit``: each container is admitted and allocated before the next."""
    zones = [{"cpu": ("8", "8", "4")}, {"cpu": ("8", "8", "4")}]
    three = [guaranteed("3", name=n) for n in "abc"]
    [failure] = verdict(cluster(zones), *three)
    assert "container 'c'" in failure.hint
    assert refused(cluster(zones, scope="pod"), *three)
    assert not refused(cluster(zones), *three[:2])


def test_rule11_an_app_container_is_confined_to_masks_holding_the_init_containers_cpus():
    """``staticPolicy.updateCPUsToReuse`` and ``generateCPUTopologyHints``' reusable-CPU rule."""
    state = cluster([{"cpu": ("8", "8", "4")}, {"cpu": ("8", "8", "8")}])
    [failure] = verdict(state, guaranteed("6"), init=[guaranteed("4", name="init")])
    assert "container 'app'" in failure.hint
    assert not refused(state, guaranteed("6"))  # without the init container, zone 1 hosts it


@pytest.mark.parametrize("policy", ["none", "best-effort", None])
def test_rule12_policy_none_best_effort_or_unknown_admit(policy):
    """``scope_none.go :: admitPolicyNone``, ``bestEffortPolicy.canAdmitPodResult``; unknown:
    SP ``filterHandlerFromTopologyManager`` returns no handler."""
    state = cluster([{"cpu": ("16", "16", "0")}] * 2, policy=policy)
    assert not refused(state, guaranteed("6"))


# -- §4.3 init containers and sidecars ------------------------------------------------------------


def test_container_scope_a_regular_init_container_is_judged_alone_before_the_apps():
    """§4.3 row 1, container scope: ``containerScope.Admit`` runs init containers first."""
    state = cluster([{"cpu": ("16", "16", "4")}] * 2)
    [failure] = verdict(state, guaranteed("2"), init=[guaranteed("6", name="setup")])
    assert "init container 'setup'" in failure.hint


def test_container_scope_an_init_containers_cpus_are_reused_by_the_app():
    """§4.3 row 1, container scope: ``updateCPUsToReuse`` adds a regular init container's CPUs."""
    state = cluster([{"cpu": ("8", "8", "4")}, {"cpu": ("8", "8", "0")}])
    assert not refused(state, guaranteed("4"), init=[guaranteed("4", name="setup")])


def test_container_scope_a_sidecars_cpus_are_not_reused():
    """§4.3 row 2, container scope: ``updateCPUsToReuse`` breaks out for restartable init containers."""
    state = cluster([{"cpu": ("8", "8", "4")}, {"cpu": ("8", "8", "0")}])
    sidecar = {**guaranteed("4", name="proxy"), "restartPolicy": "Always"}
    [failure] = verdict(state, guaranteed("4"), init=[sidecar])
    assert "container 'app'" in failure.hint


def test_pod_scope_a_regular_init_container_counts_by_max_not_added():
    """§4.3 row 1, pod scope: ``podGuaranteedCPUs`` takes max(init, apps)."""
    state = cluster([{"cpu": ("16", "16", "6")}] * 2, scope="pod")
    assert not refused(state, guaranteed("6"), init=[guaranteed("6", name="setup")])
    assert refused(state, guaranteed("6"), init=[guaranteed("7", name="setup")])


def test_pod_scope_a_sidecar_is_added_to_the_apps():
    """§4.3 row 2, pod scope: ``podGuaranteedCPUs`` adds restartable init containers."""
    state = cluster([{"cpu": ("16", "16", "6")}] * 2, scope="pod")
    sidecar = {**guaranteed("1", name="proxy"), "restartPolicy": "Always"}
    assert refused(state, guaranteed("6"), init=[sidecar])


# -- the rest of §2, §5 ---------------------------------------------------------------------------


def test_memory_and_hugepages_are_aligned_jointly():
    """``memorymanager calculateHints``: one mask must hold every memory type together."""
    zones = [
        {"memory": ("8Gi", "8Gi", "4Gi"), "hugepages-1Gi": ("4Gi", "4Gi", "0")},
        {"memory": ("8Gi", "8Gi", "0"), "hugepages-1Gi": ("4Gi", "4Gi", "2Gi")},
    ]
    assert refused(cluster(zones), guaranteed("1500m", "2Gi", **{"hugepages-1Gi": "1Gi"}))
    assert not refused(cluster(zones), guaranteed("1500m", "2Gi"))


def test_memory_no_mask_fitting_anywhere_is_no_preference_not_a_refusal():
    """``calculateHints`` returns an empty map; ``filterProvidersHints`` reads it as {nil, true} (§2.2)."""
    zones = [{"memory": ("8Gi", "8Gi", "1Gi")}] * 2
    assert not refused(cluster(zones), guaranteed("1500m", "4Gi"))


def test_pod_level_resources_get_no_cpu_or_memory_hints_but_devices_still_do():
    """``GetTopologyHints`` returns nil for pods with ``spec.resources`` (PodLevelResources, §2.1)."""
    state = cluster([{"cpu": ("16", "16", "0"), "nvidia.com/gpu": ("1", "1", "0")}] * 2)
    level = {"requests": {"cpu": "6", "memory": "1Gi"}, "limits": {"cpu": "6", "memory": "1Gi"}}
    assert not refused(state, container("app"), resources=level)
    gpu = container("app", limits={"nvidia.com/gpu": "1"})
    assert refused(state, gpu, resources=level)


def test_a_resource_no_zone_lists_is_not_aligned():
    """SP ``resourcesAvailableInAnyNUMANodes``: absent from every zone → host-level, no hints (§5.1)."""
    state = cluster([{"memory": ("8Gi", "8Gi", "8Gi")}] * 2)
    assert not refused(state, guaranteed("64"))


def test_devices_reused_from_an_init_container_confine_the_app_to_its_zone():
    """``ManagerImpl.Allocate`` (devicesToReuse) and ``generateDeviceTopologyHints``' reusable rule."""
    init = container("setup", limits={"nvidia.com/gpu": "1"})
    app = container("app", limits={"nvidia.com/gpu": "2"})
    reused = cluster([{"nvidia.com/gpu": ("2", "2", "2")}, {"nvidia.com/gpu": ("2", "2", "0")}])
    assert not refused(reused, app, init=[init])
    confined = cluster([{"nvidia.com/gpu": ("2", "2", "1")}, {"nvidia.com/gpu": ("2", "2", "2")}])
    assert refused(confined, app, init=[init])


# -- §1.1 handler order ---------------------------------------------------------------------------


def test_a_pod_refused_by_topology_reports_that_reason_alone_not_also_out_of_cpu():
    """``canAdmitPod`` stops at the first refusing handler; the topology manager runs before the
    predicate handler."""
    state = cluster([{"cpu": ("16", "16", "4")}] * 2)
    state.set_node(node_from(node("node-1", cpu="2", memory="1Ti")))
    assert reasons(verdict(state, guaranteed("6"))) == ["TopologyAffinityError"]


def test_a_pod_refused_by_sysctls_is_never_reported_as_topology():
    """``canAdmitPod``: the sysctl handler runs before the topology manager."""
    state = cluster([{"cpu": ("16", "16", "4")}] * 2)
    sysctls = {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}
    assert reasons(verdict(state, guaranteed("6"), securityContext=sysctls)) == ["SysctlForbidden"]


# -- config (§6.3, §10.1) -------------------------------------------------------------------------


@pytest.mark.parametrize("off", [False, "off", {"mode": "off"}])
def test_topology_off_turns_the_check_off(off):
    config = config_from_dict({"policies": {"nodeAdmission": {"topology": off}}})
    state = cluster([{"cpu": ("16", "16", "4")}] * 2)
    assert not refused(state, guaranteed("6"), config=config)
    assert refused(state, guaranteed("6"), config=Config())


def pools(**pool) -> Config:
    pool.setdefault("nodeSelector", {"pool": "hpc"})
    return config_from_dict({"policies": {"nodeAdmission": {"topology": {"pools": [pool]}}}})


def test_a_pool_names_the_policy_an_exporter_does_not_publish():
    state = cluster([{"cpu": ("16", "16", "4")}] * 2, policy=None, labels={"pool": "hpc"})
    assert not refused(state, guaranteed("6"))
    assert refused(state, guaranteed("6"), config=pools(topologyManagerPolicy="single-numa-node"))
    assert not refused(state, guaranteed("6"), config=pools(nodeSelector={"pool": "web"}))


def test_what_the_nrt_publishes_wins_over_the_pool():
    state = cluster([{"cpu": ("16", "16", "4")}] * 2, policy="best-effort", labels={"pool": "hpc"})
    assert not refused(state, guaranteed("6"), config=pools(topologyManagerPolicy="single-numa-node"))


def test_a_pool_without_a_static_memory_manager_drops_the_zones_memory():
    """§10.1: an exporter that publishes zone memory under memoryManagerPolicy None."""
    state = cluster([{"memory": ("8Gi", "8Gi", "1Gi")}] * 2, labels={"pool": "hpc"})
    assert refused(state, guaranteed("1500m", "2Gi"))
    assert not refused(state, guaranteed("1500m", "2Gi"), config=pools(memoryManagerPolicy="None"))


@pytest.mark.parametrize(
    ("topology", "field"),
    [
        ("sometimes", "policies.nodeAdmission.topology"),
        ({"mode": "maybe"}, "policies.nodeAdmission.topology.mode"),
        ({"pools": [{"topologyManagerPolicy": "strict"}]}, "policies.nodeAdmission.topology.pools[0]"),
        ({"pools": [{"cpuManagerPolicy": "dynamic"}]}, "topology.pools[0].cpuManagerPolicy"),
        ({"pools": [{"nodeSelector": {"a": 1}}]}, "topology.pools[0].nodeSelector"),
        ({"pool": []}, "policies.nodeAdmission.topology.pool"),
    ],
)
def test_topology_config_errors_name_the_field(topology, field):
    with pytest.raises(ConfigError) as err:
        config_from_dict({"policies": {"nodeAdmission": {"topology": topology}}}, "guard.yaml")
    assert field in str(err.value)


def test_the_engine_denies_a_pinned_pod_with_the_kubelets_reason_and_the_zones():
    state = cluster([{"cpu": ("16", "16", "4")}] * 2)
    obj = pod("p", node_name="node-1", containers=[guaranteed("6")])
    [violation] = evaluate(obj, "CREATE", state, Config()).violations
    assert violation.reason == "TopologyAffinityError"
    assert "Resources cannot be allocated with Topology locality" in violation.message
    assert "node-0: cpu 4; node-1: cpu 4" in violation.message


def test_in_a_snapshot_the_pods_on_the_node_are_already_counted_in_available():
    """Issue 27 item 4, last sentence: a snapshot cannot date its NRT, so ``available`` is taken
    as is; a running Guaranteed pod is not subtracted again."""
    state = cluster([{"cpu": ("16", "16", "6")}] * 2)
    running = pod("running", node_name="node-1", containers=[guaranteed("20")])
    state.set_pod("running", pod_record(running))
    assert not refused(state, guaranteed("6"))


def test_a_pinned_deployment_is_denied_with_the_topology_reason_in_its_message():
    """The template's pods would each be refused by ``containerScope.Admit``: a storm."""
    state = cluster([{"cpu": ("16", "16", "4")}] * 2)
    obj = deployment({"nodeName": "node-1", "containers": [guaranteed("6")]})
    [violation] = evaluate(obj, "CREATE", state, Config()).violations
    assert "TopologyAffinityError" in violation.message


# -- SMTAlignmentError (§9, issue 27 item 5) ------------------------------------------------------


def smt(**pool) -> Config:
    return pools(fullPCPUsOnly=True, threadsPerCore=2, **pool)


def test_full_pcpus_only_refuses_an_odd_cpu_count_with_the_kubelets_message():
    """``staticPolicy.Allocate``: ``numCPUs % cpuGroupSize != 0`` → ``SMTAlignmentError``."""
    state = cluster(TWO_BY_16, labels={"pool": "hpc"})
    [failure] = verdict(state, guaranteed("3"), config=smt())
    assert failure.reason == "SMTAlignmentError"
    assert failure.message == "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2"
    assert not verdict(state, guaranteed("4"), config=smt())


def test_full_pcpus_only_holds_without_an_nrt_and_under_any_topology_policy():
    """``scope_none.go :: admitPolicyNone`` still calls every provider's ``Allocate``."""
    state = ClusterState()
    state.set_node(node_from(node("node-1", cpu="64", memory="1Ti", labels={"pool": "hpc"})))
    assert reasons(verdict(state, guaranteed("3"), config=smt())) == ["SMTAlignmentError"]
    assert reasons(verdict(state, guaranteed("3"))) == []  # nothing declared: not predicted


def test_smt_ignores_burstable_and_fractional_cpu_containers():
    """``guaranteedCPUs`` is 0 for them: they run in the shared pool."""
    state = cluster(TWO_BY_16, labels={"pool": "hpc"})
    assert not verdict(state, burstable("3"), config=smt())
    assert not verdict(state, guaranteed("1500m"), config=smt())


def test_container_scope_reports_whichever_of_topology_and_smt_refuses_the_first_container():
    """``containerScope.Admit``: merge then ``allocateAlignedResources``, container by container."""
    state = cluster([{"cpu": ("16", "16", "4")}] * 2, labels={"pool": "hpc"})
    first_odd = verdict(state, guaranteed("3", name="a"), guaranteed("6", name="b"), config=smt())
    assert reasons(first_odd) == ["SMTAlignmentError"]
    first_too_big = verdict(state, guaranteed("6", name="a"), guaranteed("3", name="b"), config=smt())
    assert reasons(first_too_big) == ["TopologyAffinityError"]


def test_pod_scope_checks_smt_after_the_pods_merge():
    """``podScope.Admit``: one merge for the pod, then ``Allocate`` for each container."""
    state = cluster([{"cpu": ("16", "16", "4")}] * 2, scope="pod", labels={"pool": "hpc"})
    assert reasons(verdict(state, guaranteed("3", name="a"), guaranteed("6", name="b"), config=smt())) == [
        "TopologyAffinityError"
    ]


@pytest.mark.parametrize(
    ("pool", "field"),
    [
        ({"fullPCPUsOnly": True}, "pools[0].threadsPerCore: is required"),
        ({"fullPCPUsOnly": "yes", "threadsPerCore": 2}, "pools[0].fullPCPUsOnly"),
        ({"fullPCPUsOnly": True, "threadsPerCore": 0}, "pools[0].threadsPerCore"),
    ],
)
def test_smt_config_errors_name_the_field(pool, field):
    with pytest.raises(ConfigError) as err:
        config_from_dict({"policies": {"nodeAdmission": {"topology": {"pools": [pool]}}}}, "guard.yaml")
    assert field in str(err.value)
