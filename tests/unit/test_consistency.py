"""One verdict on every face (issue 29): the server, ``check``, ``test``, ``explain`` and
``audit`` are different doors to one engine, so over the same cluster state and object they
must agree. States: the bundled example cluster, the policy suite's clusters, and generated
ones (GPU pools per scheduler, DRA slices and claims, a storm). A disagreement is a bug.

The faces run in-process (as their commands call them) to keep this fast; the console-script
tests cover the wiring."""

from __future__ import annotations

import base64
import copy
import json
import re
import time
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import jsonpatch
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.dra_builders import claim, gpus, resource_slice, result
from tests.helpers.paths import EXAMPLES, ROOT
from webhook import policytest
from webhook.allocation import AllocationGuard
from webhook.audit import run_audit
from webhook.binding import BindGuard
from webhook.config import Config, config_from_dict
from webhook.coordination.allocations import pool_table
from webhook.coordination.reservations import node_table
from webhook.dryrun import check_documents
from webhook.explain import explain
from webhook.serve.app import create_app
from webhook.state.inventory import read_inventory
from webhook.state.snapshot import load_snapshot
from webhook.state.source import FixedState

FITS = re.compile(r"Nodes it fits on now: ([^.]+)\.")
PLURAL = {"Pod": "pods", "Deployment": "deployments", "Job": "jobs", "RayCluster": "rayclusters"}

# -- the faces ---------------------------------------------------------------------------------


def server_verdict(obj: dict, state_of, conf: Config, tmp: Path, now: float) -> tuple[bool, list[str]]:
    """As kube-apiserver asks ``serve``: /mutate first (fix mode's patch applied), then
    /validate the object as patched; the app built as ``serve`` builds it (a bind guard and an
    allocation guard), its clock at ``now`` as the other faces' are."""
    clock = SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
    clock.time = lambda: now
    # Decisions and the metrics' pruning of storm breakers read the same clock, as in a server.
    with mock.patch("webhook.serve.app.time", clock), mock.patch("webhook.serve.metrics.time", clock):
        return _mutate_then_validate(obj, state_of, conf, tmp)


def _mutate_then_validate(obj: dict, state_of, conf: Config, tmp: Path) -> tuple[bool, list[str]]:
    app = create_app(
        conf,
        FixedState(state_of()),
        bind_guard=BindGuard(conf, node_table(tmp / "binds")),
        allocation_guard=AllocationGuard(conf, pool_table(tmp / "allocations")),
    )
    client = app.test_client()
    mutated = client.post("/mutate", json=review_of(obj)).get_json()["response"]
    if mutated.get("patch"):
        obj = jsonpatch.apply_patch(obj, json.loads(base64.b64decode(mutated["patch"])))
    response = client.post("/validate", json=review_of(obj)).get_json()["response"]
    reasons = response.get("status", {}).get("reason", "")
    return response["allowed"], sorted(r for r in reasons.split(",") if r)


def review_of(obj: dict, operation: str = "CREATE") -> dict:
    group, _, version = obj["apiVersion"].rpartition("/")
    metadata = obj["metadata"]
    kind = {"group": group, "version": version, "kind": obj["kind"]}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"u-{name_of(obj)}",
            "kind": kind,
            "resource": {"group": group, "version": version, "resource": PLURAL[obj["kind"]]},
            "namespace": metadata.get("namespace", "default"),
            "name": name_of(obj),
            "operation": operation,
            "userInfo": {"username": "jane@example.com"},
            "object": obj,
        },
    }


def name_of(obj: dict) -> str:
    metadata = obj["metadata"]
    return metadata.get("name") or metadata["generateName"] + "x"


def check_result(obj: dict, state, config: Config, tmp: Path, now: float):
    """``admit-guard check`` on one file holding ``obj``."""
    path = tmp / f"{name_of(obj)}.yaml"
    path.write_text(yaml.safe_dump(obj))
    results, errors = check_documents([str(path)], state, config, now=now)
    assert not errors, errors
    [judged] = results
    return judged


def policy_case_passes(
    obj: dict, state, config: Config, allowed: bool, reasons: list[str], now: float
) -> None:
    """``admit-guard test`` with a case that expects the server's verdict."""
    expect = {"allowed": allowed, "reasons": reasons}
    case = policytest.Case(
        "same", copy.deepcopy(obj), "CREATE", None, "jane@example.com", (), config, expect, now
    )
    outcome = policytest.run_case(policytest.TestFile("consistency", [case], state), case)
    assert outcome.passed, outcome.failures


def agree(obj: dict, state_of, config: Config, tmp: Path, now: float) -> None:
    """The server, check and test give one verdict; check's suggestions are nodes explain fits."""
    allowed, reasons = server_verdict(obj, state_of, config, tmp, now)
    judged = check_result(obj, state_of(), config, tmp, now)
    if judged.skipped:
        assert allowed and not judged.decision.violations
        return
    checked = sorted({v.reason for v in judged.decision.violations})
    assert (judged.decision.allowed, checked) == (allowed, reasons), judged.decision.violations
    policy_case_passes(obj, state_of(), config, allowed, reasons, now)
    suggestions_fit(obj, judged, state_of(), config)


def suggestions_fit(obj: dict, judged, state, config: Config) -> None:
    """A node check denies the pod on is never one explain says it fits, nor one a message
    suggests; every suggested node is one explain says it fits."""
    if state is None:
        return
    explained = explain(obj, state, config)  # explain sets the pod's own pin aside
    if not explained:
        return
    fitting = {n.node for e in explained for n in e.nodes if n.fits and not n.scheduler}
    denied_on = {v.node for v in judged.decision.violations if v.node and not _caused_by_the_pin(v)}
    assert not denied_on & fitting, (denied_on, fitting)
    for violation in judged.decision.violations:
        for names in FITS.findall(violation.message):
            suggested = {n.strip() for n in names.split(",")}
            assert suggested <= fitting, (violation.message, fitting)
            assert not suggested & denied_on


def _caused_by_the_pin(violation) -> bool:
    """Denied for pinning itself (PinnedNodeName, or bypassing the devices' owner): the node
    would take the pod from its scheduler, so explain may say it fits."""
    return violation.reason == "PinnedNodeName" or "bypassing every scheduler" in violation.message


# -- the bundled example cluster and the workloads ---------------------------------------------

WORKLOAD_FILES = sorted((EXAMPLES / "workloads").glob("*.yaml"))


@pytest.mark.parametrize("path", WORKLOAD_FILES, ids=lambda p: p.stem)
def test_the_faces_agree_on_the_examples(tmp_path, path):
    obj = yaml.safe_load(path.read_text())
    state_of = lambda: load_snapshot([str(EXAMPLES / "cluster")])  # noqa: E731
    agree(obj, state_of, Config(), tmp_path, time.time())


# -- the policy suite's clusters and cases -----------------------------------------------------


def suite_cases() -> list[tuple[str, int]]:
    """(test file, case index) of every CREATE of a kind the server routes, with a cluster."""
    found = []
    for path in policytest.discover([str(ROOT / "tests" / "policy"), str(EXAMPLES / "policy-test")]):
        test_file = policytest.load_test_file(path)
        for i, case in enumerate(test_file.cases):
            routed = case.obj.get("kind") in PLURAL and case.operation == "CREATE" and case.bind_to is None
            if routed and test_file.state is not None and not case.user.startswith("system:"):
                found.append((path, i))
    return found


@pytest.mark.parametrize(
    "path,index", suite_cases(), ids=lambda v: Path(v).stem if isinstance(v, str) else str(v)
)
def test_the_faces_agree_on_the_policy_suites_clusters(tmp_path, path, index):
    case = policytest.load_test_file(path).cases[index]
    state_of = lambda: policytest.load_test_file(path).state  # noqa: E731
    agree(case.obj, state_of, case.config, tmp_path, case.now)


# -- generated: GPU pools per scheduler, DRA slices and claims ---------------------------------

POOLS = {
    "policies": {
        "deviceScheduler": {
            "owners": [
                {
                    "resource": "nvidia.com/gpu",
                    "scheduler": "volcano",
                    "nodeSelector": {"matchLabels": {"pool": "batch"}},
                }
            ]
        }
    }
}
SCHEDULERS = ("default-scheduler", "volcano")


def gpu_node(name: str, pool: str, gpus_: int, pods: int) -> dict:
    allocatable = {"cpu": "8", "memory": "64Gi", "pods": str(pods), "nvidia.com/gpu": str(gpus_)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"pool": pool}},
        "status": {"allocatable": allocatable},
    }


def gpu_pod(name: str, node: str | None, scheduler: str, gpus_: int, phase: str = "Running") -> dict:
    spec = {
        "schedulerName": scheduler,
        "containers": [{"name": "c", "image": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus_)}}}],
    }
    if node:
        spec["nodeName"] = node
    metadata = {"name": name, "namespace": "ml", "uid": f"uid-{name}"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": {"phase": phase}}


@st.composite
def clusters(draw) -> list[dict]:
    """Three GPU nodes in two pools, some device pods on them, a DRA slice on one node."""
    objects = []
    for i in range(3):
        name = f"gpu-{i}"
        objects.append(
            gpu_node(
                name,
                draw(st.sampled_from(("batch", "serve"))),
                draw(st.integers(0, 2)),
                draw(st.integers(0, 3)),
            )
        )
        for j in range(draw(st.integers(0, 2))):
            objects.append(gpu_pod(f"p-{i}-{j}", name, draw(st.sampled_from(SCHEDULERS)), 1))
    objects.append(resource_slice("gpu-0-dra", pool="gpu-0", node_name="gpu-0", devices=gpus("d-0")))
    if draw(st.booleans()):
        objects.append(claim("held", namespace="ml", results=[result("d-0", pool="gpu-0")], node="gpu-0"))
    return objects


@st.composite
def workloads(draw) -> dict:
    """A GPU pod or Deployment, pinned or not, of either scheduler, maybe with a DRA claim."""
    pod = gpu_pod(
        "w",
        draw(st.sampled_from((None, "gpu-0", "gpu-1", "gpu-2"))),
        draw(st.sampled_from(SCHEDULERS)),
        draw(st.integers(1, 2)),
        "Pending",
    )
    if draw(st.booleans()):
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "held"}]
    if draw(st.booleans()):
        return pod
    template = {"metadata": {"labels": {"app": "w"}}, "spec": pod["spec"]}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "w", "namespace": "ml"},
        "spec": {"selector": {"matchLabels": {"app": "w"}}, "template": template},
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cluster=clusters(), obj=workloads(), pools=st.booleans())
def test_the_faces_agree_on_generated_gpu_clusters(tmp_path_factory, cluster, obj, pools):
    tmp = tmp_path_factory.mktemp("gen")
    snapshot = tmp / "cluster.yaml"
    snapshot.write_text(yaml.safe_dump_all(cluster))
    config = config_from_dict(POOLS if pools else {})
    agree(obj, lambda: load_snapshot([str(snapshot)]), config, tmp, time.time())


# -- the audit sees what the server would deny for an existing object --------------------------


def test_the_audit_reports_what_the_server_denies_for_existing_objects(tmp_path):
    """A pinned Deployment already in the cluster, and a device two claims hold: the server denies
    writing either; the audit of a snapshot holding them names both."""
    node = gpu_node("gpu-0", "serve", 1, 110)
    pinned = yaml.safe_load((EXAMPLES / "workloads" / "incident-1-pinned-deployment.yaml").read_text())
    pinned["spec"]["template"]["spec"]["nodeName"] = "gpu-0"
    pinned["metadata"]["namespace"] = "ml"
    dra = resource_slice("gpu-0-dra", pool="gpu-0", node_name="gpu-0", devices=gpus("d-0"))
    holders = [
        claim(n, namespace="ml", results=[result("d-0", pool="gpu-0")], node="gpu-0") for n in ("a", "b")
    ]
    snapshot = tmp_path / "cluster.yaml"
    snapshot.write_text(yaml.safe_dump_all([node, dra, holders[0]]))
    allowed, reasons = server_verdict(
        pinned, lambda: load_snapshot([str(snapshot)]), Config(), tmp_path, time.time()
    )
    assert not allowed and reasons == ["PinnedNodeName"]
    snapshot.write_text(yaml.safe_dump_all([node, dra, holders[0], holders[1], pinned]))
    report = run_audit(read_inventory([str(snapshot)]), Config(), time.time())
    assert {"PinnedNodeName", "DeviceAlreadyAllocated"} <= {f.type for f in report.findings}


def test_what_a_face_cannot_judge_it_says_never_passes(tmp_path):
    """A custom resource outside the workload table is SKIP in check; the audit without claims
    says device findings were not judged; check without a cluster warns NoClusterState."""
    unknown = {
        "apiVersion": "example.com/v1",
        "kind": "Trainer",
        "metadata": {"name": "t", "namespace": "ml"},
    }
    assert check_result(unknown, None, Config(), tmp_path, time.time()).skipped
    snapshot = tmp_path / "nodes.yaml"
    snapshot.write_text(
        yaml.safe_dump_all([gpu_node("gpu-0", "serve", 1, 110), resource_slice(devices=gpus("d-0"))])
    )
    report = run_audit(read_inventory([str(snapshot)]), Config(), time.time())
    assert "DeviceAlreadyAllocated" in report.not_judged
    stateless = check_result(
        gpu_pod("s", "gpu-0", "default-scheduler", 1), None, Config(), tmp_path, time.time()
    )
    assert any("NoClusterState" in w for w in stateless.decision.notices)
