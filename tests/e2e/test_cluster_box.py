"""The cluster in a box (issue 28), small: each incident happens without the guard and does not
with it, through the webhooks rendered from deploy/; a rule dropped from the rendered
configuration lets the incident back in; the box's cluster shares no code with the guard's
checks.

The scenarios need ``kubectl`` to render deploy/ (kustomize is built into it) and are skipped,
saying so, where it is missing; the import test and the rule matcher's tests need nothing.
"""

from __future__ import annotations

import ast
import copy
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers.cluster import deploy
from tests.helpers.cluster.box import WANTED, Box, Setting
from tests.helpers.cluster.controllers import VOLCANO_JOBS
from tests.helpers.cluster.numa import CpuManager, Exporter
from tests.helpers.cluster.routes import shipped_routes, without
from tests.helpers.cluster.scenarios import GPU, guaranteed_spec, node, pod_spec, run, run_both
from tests.helpers.cluster.webhooks import Attributes, _rule_matches
from tests.helpers.paths import TESTS

BOX = TESTS / "helpers" / "cluster"
# What a cluster runs of the project: the certificate issuer deploy/ is rendered with. The guard
# itself runs as a separate process (``admit-guard serve``).
ALLOWED_WEBHOOK = {"webhook.certs"}
ALLOWED_TESTS = {
    "tests.helpers.fake_apiserver",
    "tests.helpers.live_server",
    "tests.helpers.builders",
    "tests.helpers.paths",
}
needs_kubectl = pytest.mark.skipif(deploy.kubectl() is None, reason="kubectl renders deploy/ (kustomize)")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = set()
    for item in ast.walk(tree):
        if isinstance(item, ast.Import):
            found.update(alias.name for alias in item.names)
        elif isinstance(item, ast.ImportFrom) and item.level == 0 and item.module:
            found.add(item.module)
    return found


def test_the_box_imports_from_webhook_only_what_a_cluster_runs():
    """Scanned through the test modules it uses too, so no path leads to the guard's checks."""
    seen, todo = set(), [*BOX.glob("*.py")]
    root = BOX.parents[2]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in _imports(path):
            if module.startswith("webhook"):
                assert module in ALLOWED_WEBHOOK, f"{path.name} imports {module}"
            elif module.startswith("tests.") and not module.startswith("tests.helpers.cluster"):
                assert module in ALLOWED_TESTS, f"{path.name} imports {module}"
                todo.append(root / (module.replace(".", "/") + ".py"))
    assert len(seen) > len(list(BOX.glob("*.py")))  # the followed test modules were scanned


def _attrs(resource: str, subresource: str = "", operation: str = "CREATE") -> Attributes:
    return Attributes(operation, "", "v1", resource, "Pod", "default", "p", {}, subresource=subresource)


@pytest.mark.parametrize(
    ("resources", "resource", "subresource", "matches"),
    [
        (["pods"], "pods", "", True),
        (["pods"], "pods", "binding", False),  # a resource rule never takes its subresources
        (["pods/binding"], "pods", "binding", True),
        (["pods/*"], "pods", "status", True),
        (["*"], "pods", "binding", False),
        (["*/binding"], "pods", "binding", True),
        (["*/*"], "pods", "status", True),
    ],
)
def test_rules_match_resources_and_subresources_as_the_api_server_does(
    resources, resource, subresource, matches
):
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": resources}
    assert _rule_matches(rule, _attrs(resource, subresource)) is matches
    assert _rule_matches(rule, _attrs(resource, subresource, "UPDATE")) is False


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    return deploy.render(tmp_path_factory.mktemp("rendered"))


def _calm(guarded) -> None:
    """With the guard: no pod failed, every wanted pod runs or says why it waits."""
    failed = [p["status"]["reason"] for p in guarded.failed()]
    assert failed == [], (failed, guarded.warnings, [c for c in guarded.calls if "error" in c.outcome])
    assert guarded.unexplained() == []


@needs_kubectl
def test_nodename_storm(rendered):
    none, guarded = run_both("nodename-storm", rendered=rendered)
    assert len(none.failed()) >= 20
    assert {p["status"]["reason"] for p in none.failed()} == {"OutOfcpu"}
    [burnt] = none.jobs  # the Job's pods each failed, up to its backoffLimit, then the Job
    assert [c["reason"] for c in burnt["status"]["conditions"]] == ["BackoffLimitExceeded"]
    assert burnt["status"]["failed"] == burnt["spec"]["backoffLimit"] + 1
    _calm(guarded)
    assert guarded.jobs == []  # refused at CREATE, no pod made
    assert sum("PinnedNodeName" in message for message in guarded.refused) == 2
    assert guarded.counts["creates_denied"] >= 1  # the legacy ReplicaSet's pods meet the pod webhook
    assert any("PinnedNodeName" in message for message in guarded.refused)  # the new Deployment
    [replica_set] = guarded.replica_sets
    [condition] = replica_set["status"]["conditions"]
    assert condition["reason"] == "FailedCreate" and "OutOfcpu" in condition["message"]


@needs_kubectl
def test_two_schedulers(rendered):
    none, guarded = run_both("two-schedulers", rendered=rendered)
    assert none.unexpected_admission_errors() >= 1
    _calm(guarded)
    assert len(guarded.running()) == 3  # one GPU per node, each handed out once


@needs_kubectl
def test_dra_allocators(rendered):
    none, guarded = run_both("dra-allocators", rendered=rendered)
    assert none.devices_twice() >= 1
    assert any(e["reason"] == "FailedPrepareDynamicResources" for e in none.events)
    _calm(guarded)
    assert guarded.devices_twice() == 0 and len(guarded.running()) == 3


@needs_kubectl
def test_slow_apiserver(rendered):
    none, guarded = run_both("slow-apiserver", rendered=rendered)
    assert none.unexpected_admission_errors() >= 1
    _calm(guarded)


@needs_kubectl
def test_guard_outage_leaks_under_failure_policy_ignore_then_recovers(rendered):
    none, guarded = run_both("guard-outage", rendered=rendered)
    assert none.phases["outage"]["UnexpectedAdmissionError"] >= 1
    assert none.phases["end"]["UnexpectedAdmissionError"] >= 1
    assert guarded.phases["outage"]["UnexpectedAdmissionError"] >= 1  # what leaks while it is down
    assert guarded.phases["end"]["UnexpectedAdmissionError"] == 0  # and it recovers
    # The one fail-closed webhook refuses a pinned template while no replica answers.
    assert any('failed calling webhook "pinned-templates.admit-guard.io"' in m for m in guarded.refused)


@needs_kubectl
def test_topology_storm(rendered):
    """Pods that fit every node in total but no one NUMA zone: kube-scheduler binds them anyway,
    the kubelet fails each and the ReplicaSet replaces it; the guard refuses those binds."""
    none, guarded = run_both("topology-storm", rendered=rendered)
    assert {p["status"]["reason"] for p in none.failed()} == {"TopologyAffinityError"}
    assert {p["status"]["message"] for p in none.failed()} == {
        "Pod was rejected: Resources cannot be allocated with Topology locality"
    }
    assert len(none.failed()) >= 3  # the two that fit no zone failed, and so did replacements
    _calm(guarded)
    assert len(guarded.running()) == 1  # the one pod a zone has room for
    pending = [p for p in guarded.pods if WANTED in p["metadata"]["labels"] and not p["spec"].get("nodeName")]
    assert len(pending) == 2 and guarded.counts["binds_denied"] >= 2
    for pod in pending:
        [condition] = pod["status"]["conditions"]
        assert (
            "TopologyAffinityError: Resources cannot be allocated with Topology locality"
            in condition["message"]
        )


def _storm_back(outcome) -> None:
    assert len(outcome.failed()) >= 20


def _pinned_deployment_admitted(outcome) -> None:
    assert sum("PinnedNodeName" in message for message in outcome.refused) == 1  # the Job's alone


def _devices_twice(outcome) -> None:
    assert outcome.devices_twice() >= 1


def _unexpected_admission_errors(outcome) -> None:
    assert outcome.unexpected_admission_errors() >= 1


# (scenario, the route taken out, what comes back); each is one resource of one shipped rule,
# the one the scenario's guarded assertion above stands on. Every other route is proven by
# test_cluster_box_routes.py through the running guard.
DROPPED = [
    ("nodename-storm", "pods.admit-guard.io", "pods", _storm_back),
    ("nodename-storm", "pinned-templates.admit-guard.io", "deployments", _pinned_deployment_admitted),
    ("two-schedulers", "bindings.admit-guard.io", "pods/binding", _unexpected_admission_errors),
    ("dra-allocators", "resourceclaims.admit-guard.io", "resourceclaims/status", _devices_twice),
]


def _dropped_id(case) -> str:
    return f"{case[0]}-without-{case[2]}"


@pytest.fixture(scope="module")
def dropped_runs(rendered):
    """Each case of ``DROPPED`` run with its route taken out, two boxes at a time (each with its
    own store and guard), so that one's guard starts while the other's cluster runs: the
    outcome, or what the run raised, by case id."""

    def one(case):
        scenario, webhook, resource, _ = case
        [route] = [r for r in shipped_routes() if r.webhook == webhook and r.resource == resource]
        broken = copy.deepcopy(rendered)
        configurations = without(broken.webhook_configurations(), route)
        broken.docs = [d for d in broken.docs if d not in broken.webhook_configurations()] + configurations
        # A longer cache lag: every pod of a burst is created before either scheduler binds.
        try:
            return run(scenario, "guard", rendered=broken, lag_ms=2000)
        except Exception as err:  # handed to the case's own test
            return err

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(map(_dropped_id, DROPPED), pool.map(one, DROPPED), strict=True))


@needs_kubectl
@pytest.mark.parametrize(
    ("scenario", "webhook", "resource", "back"), DROPPED, ids=[_dropped_id(c) for c in DROPPED]
)
def test_a_rule_dropped_from_the_rendered_configuration_lets_the_incident_back_in(
    dropped_runs, scenario, webhook, resource, back
):
    outcome = dropped_runs[_dropped_id((scenario, webhook, resource, back))]
    if isinstance(outcome, Exception):
        raise outcome
    back(outcome)


def test_the_batch_scheduler_binds_a_gang_all_or_nothing(tmp_path):
    """Without the guard (no webhooks, no kubectl): a gang of three on two free GPUs gets no
    node at all and says why; a gang of two on two free GPUs is bound whole."""
    nodes = [
        node(f"gpu-{pool}{i}", cpu="16", labels={"pool": pool}, **{GPU: "1"}) for pool in "ab" for i in (1, 2)
    ]
    devices = {n["metadata"]["name"]: {GPU: ["gpu-0"]} for n in nodes}
    setting = Setting(nodes, devices, schedulers=("volcano",), scheduler_lag=0.05)
    box = Box(setting, tmp_path, seed=1, rendered=None)
    with box:
        for pool, replicas in (("a", 3), ("b", 2)):
            template = {"spec": pod_spec({GPU: "1"}, "volcano", nodeSelector={"pool": pool})}
            task = {"name": "worker", "replicas": replicas, "template": template}
            gang = {"metadata": {"name": f"gang-{pool}", "namespace": "default"}, "spec": {"tasks": [task]}}
            box.create(VOLCANO_JOBS, gang)
        box.until(1.5)
    pods = {p["metadata"]["name"]: p for p in box.api.list("pods")}
    assert sorted(pods) == [*(f"gang-a-worker-{i}" for i in range(3)), "gang-b-worker-0", "gang-b-worker-1"]
    assert not any(pods[f"gang-a-worker-{i}"]["spec"].get("nodeName") for i in range(3))
    [condition] = pods["gang-a-worker-0"]["status"]["conditions"]
    # 1/3 once the scheduler's cache holds all three; under load it may judge the gang while its
    # cache holds fewer (0/1, 1/2): still not ready, never bound.
    assert re.fullmatch(r"pod group is not ready, \d/[123] tasks in gang unschedulable", condition["message"])
    assert {pods[f"gang-b-worker-{i}"]["spec"]["nodeName"] for i in range(2)} == {"gpu-b1", "gpu-b2"}


def _numa_pod(uid: str, cpu: str, init: str | None = None, guaranteed: bool = True) -> dict:
    spec = guaranteed_spec(0)
    amounts = {"cpu": cpu, "memory": "1Gi"}
    spec["containers"][0]["resources"] = {"requests": amounts, "limits": amounts if guaranteed else {}}
    if init:
        init_amounts = {"cpu": init, "memory": "1Gi"}
        spec["initContainers"] = [{"name": "init", "resources": {"requests": init_amounts,
                                                                 "limits": init_amounts}}]  # fmt: skip
    return {"metadata": {"uid": uid}, "spec": spec}


def test_the_box_kubelet_refuses_exclusive_cpus_that_fit_the_node_but_no_one_zone():
    cpus = CpuManager([4, 4])
    assert cpus.admit(_numa_pod("a", "3")) is None and cpus.free() == [1, 4]  # the lowest zone with room
    assert cpus.admit(_numa_pod("b", "3")) is None and cpus.free() == [1, 1]
    assert cpus.admit(_numa_pod("c", "2")) == "Resources cannot be allocated with Topology locality"
    assert cpus.admit(_numa_pod("d", "2", guaranteed=False)) is None  # shared pool: no hint, no zone
    assert cpus.admit(_numa_pod("e", "1500m")) is None and cpus.free() == [1, 1]  # not whole CPUs: shared
    assert CpuManager([4, 4]).admit(_numa_pod("f", "5")) is not None  # wider than any zone


def test_the_box_kubelet_lets_app_containers_reuse_what_an_init_container_held():
    cpus = CpuManager([4, 4])
    assert cpus.admit(_numa_pod("a", "2", init="3")) is None
    assert cpus.free() == [2, 4]  # the app reused two of the init container's three, one went back


def test_the_exporter_publishes_a_zone_change_only_after_its_lag():
    cpus = CpuManager([4, 4])
    exporter = Exporter("numa-1", cpus, lag=0.2)
    assert [z["resources"][0]["available"] for z in exporter.nrt()["zones"]] == ["4", "4"]
    cpus.admit(_numa_pod("a", "3"))
    assert exporter.due() is None  # the change is seen, not yet published
    time.sleep(0.25)
    nrt = exporter.due()
    assert [z["resources"][0]["available"] for z in nrt["zones"]] == ["1", "4"]
    assert {a["name"]: a["value"] for a in nrt["attributes"]} == {
        "topologyManagerPolicy": "single-numa-node",
        "topologyManagerScope": "container",
    }
    assert exporter.due() is None
