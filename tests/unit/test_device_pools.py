"""Device ownership per node (issue 20 §2): owners per node pool, autodetection on the node at
the moment of the race, and no cluster-wide majority vote. The webhook (pods, templates,
binds) and the audit judge the same node the same way."""

from __future__ import annotations

import pytest

from tests.helpers.binds import binding, state_with
from tests.helpers.builders import gpu_job, node, pod
from webhook.admission import parse_review
from webhook.audit import node_findings
from webhook.binding import BindGuard
from webhook.config import ConfigError, config_from_dict
from webhook.engine import evaluate
from webhook.policies.device_scheduler import REASON as MIXED
from webhook.state import ClusterState, node_from, pod_record
from webhook.state.source import FixedState

GPU = "nvidia.com/gpu"
TOLERATE_GPU = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
POOLS = {
    "owners": [
        {"resource": GPU, "scheduler": "volcano", "nodeSelector": {"matchLabels": {"pool": "batch"}}},
        {
            "resource": GPU,
            "scheduler": "default-scheduler",
            "nodeSelector": {"matchLabels": {"pool": "interactive"}},
        },
    ]
}


def gpu_node(name: str, pool: str | None = None, gpus: str = "8", **kwargs) -> dict:
    labels = {"pool": pool} if pool else {}
    return node(name, cpu="64", memory="512Gi", labels=labels, extra={GPU: gpus}, **kwargs)


def gpu_pod(name: str, scheduler: str | None = None, node_name: str | None = None, **spec) -> dict:
    return pod(name, namespace="ml", requests={GPU: "1"}, scheduler=scheduler, node_name=node_name, **spec)


def config(**device_scheduler):
    return config_from_dict({"policies": {"deviceScheduler": device_scheduler}})


def verdict(obj, state, cfg=None, operation="CREATE"):
    decision = evaluate(obj, operation, state, cfg or config())
    return [v.reason for v in decision.violations], " ".join(v.message for v in decision.violations)


def bind(state: ClusterState, cfg, name: str, node_name: str) -> dict:
    req = parse_review(_json(binding(name, node_name)))
    return BindGuard(cfg, None).review(req, FixedState(state)).response


def _json(obj) -> bytes:
    import json

    return json.dumps(obj).encode()


# -- the flip: no cluster-wide majority ------------------------------------------------------


@pytest.fixture
def two_teams() -> ClusterState:
    """Volcano on two GPU nodes (four pods), eight notebooks of default-scheduler on a third."""
    objects = [gpu_node("batch-1"), gpu_node("batch-2"), gpu_node("notebooks-1")]
    objects += [gpu_pod(f"train-{i}", "volcano", f"batch-{1 + i % 2}") for i in range(4)]
    objects += [gpu_pod(f"notebook-{i}", node_name="notebooks-1") for i in range(8)]
    return state_with(*objects)


def test_eight_notebooks_on_their_own_node_do_not_flip_the_owner_of_every_gpu(two_teams):
    # The old rule took default-scheduler (8 pods against 4) as the cluster-wide owner and
    # denied every Volcano GPU job.
    assert verdict(gpu_job("volcano"), two_teams) == ([], "")
    assert verdict(gpu_job(), two_teams) == ([], "")


def test_a_node_with_no_device_pods_is_a_safe_place(two_teams):
    two_teams.set_node(node_from(gpu_node("fresh")))
    assert verdict(gpu_job("kai-scheduler"), two_teams) == ([], "")


def test_a_pod_is_denied_only_when_every_node_it_can_reach_mixes(two_teams):
    reasons, message = verdict(gpu_job("kai-scheduler"), two_teams)
    assert reasons == ["MixedDeviceScheduler"]
    assert "every node it can reach that offers its devices already holds another scheduler's" in message
    assert "batch-1: nvidia.com/gpu is held by pods of volcano (ml/train-0, ml/train-2)" in message
    assert "notebooks-1: nvidia.com/gpu is held by pods of default-scheduler (ml/notebook-0" in message


def test_only_the_nodes_the_pod_can_reach_count(two_teams):
    selected = gpu_job(nodeSelector={"kubernetes.io/hostname": "notebooks-1"}, schedulerName="volcano")
    reasons, message = verdict(selected, two_teams)
    assert reasons == ["MixedDeviceScheduler"] and "notebooks-1" in message and "batch-1" not in message
    # A NoSchedule taint it does not tolerate keeps it off a node as surely as a selector.
    two_teams.set_node(
        node_from(gpu_node("notebooks-1", taints=[{"key": "team", "value": "nb", "effect": "NoSchedule"}]))
    )
    assert verdict(gpu_job(), two_teams)[0] == ["MixedDeviceScheduler"]


def test_fix_mode_gives_the_scheduler_of_a_node_it_can_share(two_teams):
    two_teams.set_node(
        node_from(gpu_node("notebooks-1", taints=[{"key": "team", "value": "nb", "effect": "NoSchedule"}]))
    )
    decision = evaluate(gpu_job("default-scheduler"), "CREATE", two_teams, config(mode="fix"))
    assert decision.allowed
    assert decision.patch == [
        {"op": "replace", "path": "/spec/template/spec/schedulerName", "value": "volcano"}
    ]


# -- owners per node pool ---------------------------------------------------------------------


@pytest.fixture
def pools() -> ClusterState:
    taint = [{"key": GPU, "value": "present", "effect": "NoSchedule"}]
    return state_with(
        gpu_node("batch-1", "batch", taints=taint),
        gpu_node("batch-2", "batch", taints=taint),
        gpu_node("interactive-1", "interactive", taints=taint),
        node("cpu-1"),
    )


@pytest.mark.parametrize(
    ("scheduler", "pool", "allowed"),
    [
        ("volcano", "batch", True),
        ("default-scheduler", "interactive", True),
        ("default-scheduler", "batch", False),
        ("volcano", "interactive", False),
    ],
)
def test_each_scheduler_is_allowed_in_its_own_pool_and_denied_in_the_other(pools, scheduler, pool, allowed):
    job = gpu_job(scheduler, nodeSelector={"pool": pool}, tolerations=TOLERATE_GPU)
    reasons, message = verdict(job, pools, config(**POOLS))
    assert (reasons == []) is allowed, message
    if not allowed:
        owner = "volcano" if pool == "batch" else "default-scheduler"
        assert f"it can reach only nodes {owner} owns" in message


def test_a_pod_that_can_land_in_two_pools_is_denied_naming_both(pools):
    reasons, message = verdict(gpu_job("volcano", tolerations=TOLERATE_GPU), pools, config(**POOLS))
    assert reasons == ["MixedDeviceScheduler"]
    assert "can land on nodes of 2 owners" in message
    assert "default-scheduler owns them on interactive-1" in message
    assert "volcano owns them on batch-1, batch-2" in message
    assert "Select one pool" in message


def test_without_nodes_the_pools_its_selector_reaches_decide():
    cfg = config(**POOLS)
    assert verdict(gpu_job("volcano", nodeSelector={"pool": "batch"}), None, cfg) == ([], "")
    reasons, message = verdict(gpu_job("volcano", nodeSelector={"pool": "interactive"}), None, cfg)
    assert (
        reasons == ["MixedDeviceScheduler"]
        and "owned by default-scheduler on nodes pool=interactive" in message
    )
    reasons, message = verdict(gpu_job("volcano"), None, cfg)
    assert reasons == ["MixedDeviceScheduler"] and "pools of 2 owners" in message


def test_the_map_form_still_means_every_node(pools):
    cfg = config(owners={GPU: "volcano"})
    assert verdict(gpu_job("volcano", tolerations=TOLERATE_GPU), pools, cfg) == ([], "")
    assert verdict(gpu_job("kai", nodeSelector={"pool": "batch"}), pools, cfg)[0] == ["MixedDeviceScheduler"]


def test_a_pool_listed_first_and_a_rule_for_every_other_node_after_it(pools):
    cfg = config(owners=[POOLS["owners"][0], {"resource": GPU, "scheduler": "default-scheduler"}])
    interactive = gpu_job(nodeSelector={"pool": "interactive"}, tolerations=TOLERATE_GPU)
    assert verdict(interactive, pools, cfg) == ([], "")
    batch = gpu_job("volcano", nodeSelector={"pool": "batch"}, tolerations=TOLERATE_GPU)
    assert verdict(batch, pools, cfg) == ([], "")


# -- the race: binds and pods created on their node ----------------------------------------


@pytest.fixture
def shared() -> ClusterState:
    return state_with(
        gpu_node("gpu-1"),
        gpu_node("gpu-2"),
        gpu_pod("train-0", "volcano", "gpu-1"),
        gpu_pod("train-1", "volcano", "gpu-1"),
        gpu_pod("pending", "default-scheduler"),
    )


def test_a_bind_that_brings_a_second_scheduler_to_a_node_is_denied_naming_both_and_the_pods(shared):
    response = bind(shared, config(), "pending", "gpu-1")
    assert response["allowed"] is False
    assert response["status"]["reason"] == "MixedDeviceScheduler"
    message = response["status"]["message"]
    assert "pod ml/pending of scheduler default-scheduler would be bound to gpu-1" in message
    assert "held by pods of volcano (ml/train-0, ml/train-1)" in message


def test_a_bind_to_a_node_without_device_pods_is_allowed(shared):
    assert bind(shared, config(), "pending", "gpu-2")["allowed"] is True


def test_a_bind_in_warn_mode_is_allowed_with_the_warning(shared):
    response = bind(shared, config(mode="warn"), "pending", "gpu-1")
    assert response["allowed"] is True
    assert any(
        w.startswith("[deviceScheduler] MixedDeviceScheduler: pod ml/pending") for w in response["warnings"]
    )


def test_a_bind_is_checked_even_with_node_admission_off(shared):
    cfg = config_from_dict({"policies": {"nodeAdmission": {"mode": "off"}}})
    assert bind(shared, cfg, "pending", "gpu-1")["allowed"] is False


def test_a_bind_into_a_pool_of_another_owner_is_denied(pools):
    pools.set_pod("uid-p", pod_record(gpu_pod("p", "default-scheduler")))
    cfg = config(**POOLS)
    response = bind(pools, cfg, "p", "batch-1")
    assert response["allowed"] is False
    assert (
        "nvidia.com/gpu is owned by volcano (configured for nodes pool=batch)"
        in response["status"]["message"]
    )
    assert bind(pools, cfg, "p", "interactive-1")["allowed"] is True


def test_a_pod_created_on_a_node_with_device_pods_bypasses_their_scheduler(shared):
    reasons, message = verdict(gpu_pod("debug", node_name="gpu-1"), shared)
    assert reasons == ["MixedDeviceScheduler"]
    assert "bypassing every scheduler, on a node where nvidia.com/gpu is held by pods of volcano" in message
    assert verdict(gpu_pod("debug", node_name="gpu-2"), shared) == ([], "")


def test_the_webhook_and_the_audit_judge_a_node_the_same_way(pools):
    """The audit flags a node exactly when one of the schedulers holding its devices could not
    bind another pod there now."""
    pools.set_pod("uid-stray", pod_record(gpu_pod("stray", "default-scheduler", "batch-1")))
    pools.set_pod("uid-own", pod_record(gpu_pod("own", "volcano", "batch-2")))
    pools.set_pod("uid-v", pod_record(gpu_pod("v", "volcano", "interactive-1")))
    pools.set_pod("uid-d", pod_record(gpu_pod("d", "default-scheduler", "interactive-1")))
    for cfg, expected in ((config(**POOLS), {"batch-1", "interactive-1"}), (config(), {"interactive-1"})):
        flagged = {f.node for f in node_findings(pools, cfg, pools.nodes) if f.type == MIXED}
        refused = set()
        for name in pools.nodes:
            for scheduler in pools.device_holders(name, GPU):
                pools.set_pod("uid-next", pod_record(gpu_pod("next", scheduler)))
                if not bind(pools, cfg, "next", name)["allowed"]:
                    refused.add(name)
        assert flagged == refused == expected


# -- config ---------------------------------------------------------------------------------


def test_owners_per_pool_are_read_strictly_naming_the_field():
    bad = [
        {
            "resource": GPU,
            "scheduler": "volcano",
            "nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "Near"}]},
        },
        {"resource": GPU, "nodeSelector": {"matchLabels": {"pool": 1}}},
        {"resource": GPU, "scheduler": "v", "nodeSelector": {}},
        {
            "resource": GPU,
            "scheduler": "v",
            "nodeSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]},
        },
    ]
    with pytest.raises(ConfigError) as err:
        config(owners=bad)
    text = str(err.value)
    assert "policies.deviceScheduler.owners[0].nodeSelector.matchExpressions[0].operator: 'Near'" in text
    assert "owners[1].scheduler: must be a scheduler name" in text
    assert "owners[1].nodeSelector.matchLabels.pool: must be a string" in text
    assert "owners[2].nodeSelector: must select some nodes" in text
    assert "owners[3].nodeSelector.matchExpressions[0].values: In needs at least one value" in text


def test_a_pool_behind_a_rule_for_every_node_never_applies():
    with pytest.raises(ConfigError, match="never applies"):
        config(owners=[{"resource": GPU, "scheduler": "a"}, POOLS["owners"][0]])


def test_allocators_are_read_per_driver_glob():
    cfg = config(
        allocators={"gpu.nvidia.com": ["system:serviceaccount:volcano-system:*"], "*.amd.com": ["x"]}
    )
    settings = cfg.device_scheduler
    assert settings.allowed_allocators("gpu.nvidia.com") == ("system:serviceaccount:volcano-system:*",)
    assert settings.allowed_allocators("gpu.amd.com") == ("x",)
    assert settings.allowed_allocators("tpu.example.com") is None
    with pytest.raises(
        ConfigError, match=r"policies.deviceScheduler.allocators.gpu.nvidia.com: must be a list"
    ):
        config(allocators={"gpu.nvidia.com": "volcano"})


def test_two_binds_of_two_schedulers_device_pods_to_a_node_without_device_pods_mix_schedulers(tmp_path):
    """Nothing configured, no device pod on gpu-1 yet: the first bind (volcano's) is allowed and
    recorded with its scheduler; the second, default-scheduler's, an instant later and before
    the watch shows the first, is MixedDeviceScheduler (issue 29 item 9)."""
    from webhook.coordination.reservations import node_table

    state = state_with(gpu_node("gpu-1"), gpu_pod("a", scheduler="volcano"), gpu_pod("b"))
    guard = BindGuard(config(), node_table(tmp_path / "t"))
    first = guard.review(parse_review(_json(binding("a", "gpu-1"))), FixedState(state))
    assert first.allowed
    second = guard.review(parse_review(_json(binding("b", "gpu-1"))), FixedState(state))
    assert not second.allowed and second.reasons == ["MixedDeviceScheduler"]
    message = second.response["status"]["message"]
    assert "volcano (a bind allowed and not yet in the guard's watch)" in message
    same = state_with(gpu_node("gpu-1"), gpu_pod("a", scheduler="volcano"), gpu_pod("c", scheduler="volcano"))
    guard = BindGuard(config(), node_table(tmp_path / "u"))
    assert guard.review(parse_review(_json(binding("a", "gpu-1"))), FixedState(same)).allowed
    assert guard.review(parse_review(_json(binding("c", "gpu-1"))), FixedState(same)).allowed


def test_a_bind_in_flight_of_another_scheduler_mixes_across_replicas_through_the_nodes_lease(
    tmp_path, leases
):
    from webhook.coordination.reservations import node_table

    _, store = leases
    state = state_with(gpu_node("gpu-1"), gpu_pod("a", scheduler="volcano"), gpu_pod("b"))
    one = BindGuard(config(), node_table(tmp_path / "one"), store)
    other = BindGuard(config(), node_table(tmp_path / "other"), store)
    assert one.review(parse_review(_json(binding("a", "gpu-1"))), FixedState(state)).allowed
    second = other.review(parse_review(_json(binding("b", "gpu-1"))), FixedState(state))
    assert not second.allowed and second.reasons == ["MixedDeviceScheduler"]


def test_a_bind_in_flight_of_another_scheduler_is_only_a_warning_in_warn_mode(tmp_path):
    from webhook.coordination.reservations import node_table

    state = state_with(gpu_node("gpu-1"), gpu_pod("a", scheduler="volcano"), gpu_pod("b"))
    guard = BindGuard(config(mode="warn"), node_table(tmp_path / "t"))
    assert guard.review(parse_review(_json(binding("a", "gpu-1"))), FixedState(state)).allowed
    second = guard.review(parse_review(_json(binding("b", "gpu-1"))), FixedState(state))
    assert second.allowed and any("MixedDeviceScheduler" in w for w in second.response["warnings"])
