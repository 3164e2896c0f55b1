"""The policy registry: a policy is one module and one entry in ``policies/registry.py``.

The engine, the config reader, VAP rendering and the docs take the policies from the
registry; the kubelet's checks are one table in the kubelet's order whose reasons are the
ones ``kube/rejection.py`` recognises on the pods the kubelet failed.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest

from tests.helpers.paths import ROOT
from webhook.checks import KUBELET_CHECKS
from webhook.checks.kubelet import CRITICAL_POD_REASONS
from webhook.formats.reader import Reader
from webhook.kube.reasons import EVICTED, out_of
from webhook.kube.rejection import REJECTED_PREFIX, admission_rejection
from webhook.policies import ALL_MODES, ANY_OBJECT, POD_FIELDS, POD_SHAPE, StaticPolicy
from webhook.policies.registry import POLICIES


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.NAME)
def test_every_registered_policy_exposes_the_policy_shape(policy):
    assert isinstance(policy.NAME, str) and policy.NAME[0].islower()
    assert policy.REASONS and all(isinstance(r, str) and r[0].isupper() for r in policy.REASONS)
    assert {"enforce", "off"} <= set(policy.MODES) <= set(ALL_MODES)
    assert policy.READS in (ANY_OBJECT, POD_SHAPE, POD_FIELDS)
    assert policy.STATIC is None or isinstance(policy.STATIC, StaticPolicy)
    assert dataclasses.fields(policy.Settings)[0].name == "mode"
    assert policy.Settings.__dataclass_params__.frozen and hasattr(policy.Settings, "__slots__")
    reader = Reader("guard.yaml")
    assert policy.read_settings(reader, {}, f"policies.{policy.NAME}") == policy.Settings()
    assert reader.problems == []
    assert callable(policy.check)


# A new policy, as a module of its own; the registry gains it in its import and its tuple.
NEW_POLICY = """
from dataclasses import dataclass
from webhook.policies import ALL_MODES, NO_CLUSTER_STATE, POD_SHAPE, Finding, StaticPolicy, Subject, read_mode
from webhook.state.model import PODS

NAME = "noLatestTag"
REASONS = ("LatestTag",)
MODES = ALL_MODES
READS = POD_SHAPE
STATIC = StaticPolicy([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                        "resources": ["pods"]}], [], [{"expression": "true"}])

@dataclass(frozen=True, slots=True)
class Settings:
    mode: str = "enforce"

def read_settings(reader, data, where):
    data = reader.mapping(data, where, {"mode"})
    return Settings(read_mode(reader, data, where, MODES))

def check(review, context):
    images = [c.get("image", "") for c in review.shape.spec.get("containers", [])]
    return [Finding("LatestTag", f"{review.description} runs {i}") for i in images if i.endswith(":latest")]

def check_bind(bind, context):
    images = [c.get("image", "") for c in bind.pod.spec.get("containers", [])]
    return [Finding("LatestTag", f"{bind.pod_name} runs {i} on {bind.node.name}") for i in images
            if i.endswith(":latest")]

def check_allocation(allocation, context):
    claim = str(allocation.claim.claim)
    latest = claim.endswith("-latest")
    return [Finding("LatestTag", f"ResourceClaim {claim} asks for the latest driver")] if latest else []

AUDITS = ("LatestTagNode",)
AUDIT_READS = PODS

def audit(scope, context):
    state = scope.inventory.state
    return [Finding("LatestTagNode", f"node {name} pulls :latest", node=name, severity="medium",
                    subject=Subject("", "Node", name, "v1"), count=1)
            for name in scope.node_names() if state.nodes[name].labels.get("tag") == "latest"]

def check_stateless(review, context):
    images = [c.get("image", "") for c in review.shape.spec.get("containers", [])]
    said = "{}: where {} points was not checked"
    return [Finding(NO_CLUSTER_STATE, said.format(review.description, i), advisory=True)
            for i in images if i.endswith(":latest")]
"""
USE_IT = """
import sys, types
from pathlib import Path
import webhook.policies as package

module = types.ModuleType("webhook.policies.no_latest_tag")
exec(NEW_POLICY, module.__dict__)
sys.modules[module.__name__] = package.no_latest_tag = module
path = Path(package.__file__).parent / "registry.py"
source = path.read_text()
edited = source.replace("Policy,", "Policy, no_latest_tag,", 1).replace(
    ",\\n)\\nNAMES", ",\\n    no_latest_tag,\\n)\\nNAMES", 1)
assert edited.count("no_latest_tag") == 2, "the registry's entry was not found"
registry = types.ModuleType("webhook.policies.registry")
registry.__package__ = "webhook.policies"
exec(compile(edited, str(path), "exec"), registry.__dict__)
sys.modules[registry.__name__] = package.registry = registry

from webhook.config import ConfigError, config_from_dict
from webhook.engine import evaluate
from webhook.vap import render

pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "web"},
       "spec": {"containers": [{"name": "a", "image": "a:latest"}]}}
config = config_from_dict({"policies": {"noLatestTag": {"mode": "warn"}}})
assert evaluate(pod, "CREATE", None, config).warnings == ["[noLatestTag] LatestTag: Pod web/p runs a:latest"]
exempt = config_from_dict({"exemptions": [{"namespaces": ["web"], "policies": ["noLatestTag"]}]})
assert evaluate(pod, "CREATE", None, exempt).allowed
assert [v.reason for v in evaluate(pod, "CREATE", None, config_from_dict({})).violations] == ["LatestTag"]
try:
    config_from_dict({"policies": {"noLatestTag": {"mode": "loud"}}})
except ConfigError as err:
    assert "policies.noLatestTag.mode: 'loud' is not one of" in str(err), err
else:
    raise AssertionError("no error")
names = [o["metadata"]["name"] for o in render(config)]
assert names[-2:] == ["admit-guard-no-latest-tag"] * 2, names

import json
from tests.helpers.builders import node
from tests.helpers.binds import binding
from webhook.admission import parse_review
from webhook.binding import BindGuard
from webhook.state import ClusterState, node_from, pod_record
from webhook.state.source import FixedState

state = ClusterState()
state.set_node(node_from(node("n1")))
pending = {**pod, "metadata": {"name": "p", "namespace": "ml", "uid": "uid-p"}}
state.set_pod("uid-p", pod_record(pending))
bind = parse_review(json.dumps(binding("p", "n1")).encode())
outcome = BindGuard(config_from_dict({}), None).review(bind, FixedState(state))
said = "pod ml/p runs a:latest on n1"
assert outcome.reasons == ["LatestTag"] and said in outcome.response["status"]["message"]
warned = BindGuard(config, None).review(bind, FixedState(state))
assert warned.allowed and warned.response["warnings"] == [f"[noLatestTag] LatestTag: {said}"]

# The pipeline routes a bind and a DRA allocation to the guards, which call the hooks.
import tempfile
from tests.helpers.dra_builders import claim, gpus, resource_slice, result
from tests.helpers.claims import state_with, status_update
from webhook.admission import VALIDATE
from webhook.allocation import AllocationGuard
from webhook.coordination.allocations import pool_table
from webhook.pipeline import Pipeline, read_review

def decide(review, state, config):
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = Pipeline(config, FixedState(state), bind_guard=BindGuard(config, None),
                            allocation_guard=AllocationGuard(config, pool_table(Path(tmp)), None))
        return pipeline.decide(read_review(json.dumps(review).encode()), VALIDATE, verified=True, now=0.0)

bound = decide(binding("p", "n1"), state, config_from_dict({}))
assert not bound.allowed and bound.reasons == ["LatestTag"], bound.reasons
devices = state_with(slices=[resource_slice(devices=gpus("gpu-0", "gpu-1"))])
latest = claim("gpu-latest", namespace="ml", results=[result("gpu-0")])
allocated = decide(status_update(latest), devices, config_from_dict({}))
assert not allocated.allowed and allocated.reasons == ["LatestTag"], allocated.reasons
assert "ResourceClaim ml/gpu-latest asks for the latest driver" in allocated.response["status"]["message"]
other = claim("gpu-other", namespace="ml", results=[result("gpu-1")])
assert decide(status_update(other), devices, config_from_dict({})).allowed

# The audit asks the hook and reports its type like the others'.
from webhook.audit import node_findings, policy_reports, run_audit
from webhook.state.inventory import Inventory

state.set_node(node_from(node("n2", labels={"tag": "latest"})))
report = run_audit(Inventory(state, pods_read=1), config_from_dict({}), 0.0).as_json()
assert report["findings"] == [{"type": "LatestTagNode", "severity": "medium", "namespace": "", "kind": "Node",
    "name": "n2", "node": "n2", "resource": "", "count": 1, "message": "node n2 pulls :latest"}], report
assert report["summary"]["byType"]["LatestTagNode"] == 1
[node_finding] = node_findings(state, config_from_dict({}), ["n1", "n2"])  # the server's periodic audit
assert node_finding.type == "LatestTagNode"
cluster_report = policy_reports(run_audit(Inventory(state, pods_read=1), config_from_dict({}), 0.0), 0.0)[0]
results = cluster_report["results"]
assert [r["policy"] for r in results] == ["noLatestTag"], results
blind = run_audit(Inventory(state), config_from_dict({}), 0.0)
assert "LatestTagNode" in blind.not_judged, blind.not_judged
off = config_from_dict({"policies": {"noLatestTag": {"mode": "off"}}})
assert run_audit(Inventory(state, pods_read=1), off, 0.0).findings == []

# check without cluster state asks the stateless hook.
from webhook.dryrun import check_documents
with tempfile.NamedTemporaryFile("w", suffix=".yaml") as manifest:
    json.dump(pod, manifest)
    manifest.flush()
    [checked], errors = check_documents([manifest.name], None, config)
assert errors == [] and "[noLatestTag] NoClusterState: Pod web/p: where a:latest points was not checked" in (
    checked.decision.warnings), checked.decision.warnings

# The generated reference pages list it, its hooks and its audit type.
from webhook.docs import policies_page, reasons_page
[row] = [line for line in policies_page().splitlines() if line.startswith("| `noLatestTag` |")]
assert "`check`, `check_bind`, `check_allocation`, `audit`, `check_stateless`" in row, row
assert "| `LatestTagNode` | policy `noLatestTag`, audit finding |" in reasons_page()
print("ok")
"""


def test_a_policy_is_one_module_and_one_registry_entry_on_every_path_and_in_the_generated_docs():
    """Config, engine, exemptions, VAP; a bind and a DRA allocation through the pipeline; the
    audit (the command's and the server's per-node one); check without state; the docs."""
    script = f"NEW_POLICY = {NEW_POLICY!r}\n" + textwrap.dedent(USE_IT)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok\n"


def _failed(reason: str, message: str = "") -> dict:
    return {"status": {"phase": "Failed", "reason": reason, "message": message}}


def test_every_reason_a_kubelet_check_rejects_with_is_recognised_on_a_failed_pod():
    reasons = [r for check in KUBELET_CHECKS for r in check.reasons] + list(CRITICAL_POD_REASONS)
    for reason in (out_of("cpu") if r == out_of("*") else r for r in reasons):
        if reason == EVICTED:  # also what evicting a running pod writes: only the prefix tells
            assert admission_rejection(_failed(reason)) is None
            assert admission_rejection(_failed(reason, f"{REJECTED_PREFIX}: The node had condition"))
        else:
            assert admission_rejection(_failed(reason)) is not None, reason


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.NAME)
def test_every_registered_policy_is_documented(policy):
    """In the example config, in the policy tables of the README and of docs/policies.md, and
    every reason in the pages people read (the generated reference lists them all anyway)."""
    docs = ROOT / "docs"
    assert f"  {policy.NAME}:" in (docs / "configuration.md").read_text()  # in the example config
    for table in (ROOT / "README.md", docs / "policies.md"):
        assert f"| `{policy.NAME}` |" in table.read_text(), table  # in the table of policies
    written = "".join(page.read_text() for page in docs.glob("*.md"))
    missing = [reason for reason in policy.REASONS if f"`{reason}`" not in written]
    assert missing == []
