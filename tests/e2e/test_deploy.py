"""deploy/: every overlay renders, validates against the Kubernetes schemas of two minor
versions, and keeps the properties that stop the guard from locking a cluster out."""

from __future__ import annotations

import shutil
import subprocess

import celpy
import kubernetes_validate
import pytest
import yaml

from tests.helpers.paths import ROOT
from webhook.config import Config, ReservationsConfig, config_from_dict, load_config
from webhook.engine import evaluate
from webhook.kube.workloads import pod_shape
from webhook.policytest import load_test_file
from webhook.vap import render

DEPLOY = ROOT / "deploy"
OVERLAYS = ("self-signed", "cert-manager", "static-policies", "network-policy", "client-auth")
KUBERNETES_VERSIONS = ("1.33.0", "1.35.0")
CRDS = {"cert-manager.io/v1"}  # not in the core schemas


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    """Each overlay rendered from a copy of deploy/ with freshly issued certificates. Only the
    tests of rendered manifests need kubectl; the VAP and CEL tests run without it."""
    from webhook.certs import issue

    if shutil.which("kubectl") is None:
        pytest.skip("kubectl renders kustomize: install kubectl to check the rendered manifests")

    copy = tmp_path_factory.mktemp("deploy") / "deploy"
    shutil.copytree(DEPLOY, copy, ignore=shutil.ignore_patterns("certs"))
    issue("admit-guard", "admit-guard", copy / "overlays" / "self-signed" / "certs")
    # The CA that signs the API server's client certificate: any CA will do to render.
    client_ca = issue("front-proxy", "kube-system", copy / "client-ca").directory / "ca.crt"
    shutil.copy(client_ca, copy / "overlays" / "client-auth" / "client-ca.crt")
    out = {}
    for overlay in OVERLAYS:
        text = subprocess.run(
            ["kubectl", "kustomize", str(copy / "overlays" / overlay)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        out[overlay] = [doc for doc in yaml.safe_load_all(text) if doc]
    return out


def objects(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schemas(rendered, overlay, version):
    for doc in rendered[overlay]:
        if doc["apiVersion"] in CRDS:
            continue
        kubernetes_validate.validate(doc, version, strict=True)


def test_webhooks_exclude_system_namespaces_and_only_namespaces_can_opt_out(rendered):
    for overlay, docs in rendered.items():
        for config in objects(docs, "ValidatingWebhookConfiguration") + objects(
            docs, "MutatingWebhookConfiguration"
        ):
            for hook in config["webhooks"]:
                names, opt_out = hook["namespaceSelector"]["matchExpressions"]
                assert names["operator"] == "NotIn" and {"kube-system", "admit-guard"} <= set(names["values"])
                assert opt_out == {"key": "admit-guard.io/skip", "operator": "NotIn", "values": ["true"]}
                # An object's author must not be able to label their way past a deny.
                assert "objectSelector" not in hook, (overlay, hook["name"])
                assert hook["sideEffects"] == "NoneOnDryRun"
                assert hook["admissionReviewVersions"] == ["v1"]
                assert hook["timeoutSeconds"] <= 5
                assert hook["clientConfig"]["service"]["namespace"] == "admit-guard", overlay


def test_only_narrow_webhooks_fail_closed(rendered):
    docs = rendered["self-signed"]
    hooks = [h for c in objects(docs, "ValidatingWebhookConfiguration") for h in c["webhooks"]]
    hooks += [h for c in objects(docs, "MutatingWebhookConfiguration") for h in c["webhooks"]]
    closed = [h for h in hooks if h["failurePolicy"] == "Fail"]
    assert [h["name"] for h in closed] == ["pinned-templates.admit-guard.io"]
    assert closed[0]["matchConditions"]
    assert all("pods" not in r["resources"] for r in closed[0]["rules"])
    pods = next(h for h in hooks if h["name"] == "pods.admit-guard.io")
    assert pods["failurePolicy"] == "Ignore"


def test_ca_bundles_are_filled_in_or_injected(rendered):
    for hook_config in objects(rendered["self-signed"], "ValidatingWebhookConfiguration"):
        assert all(h["clientConfig"]["caBundle"] for h in hook_config["webhooks"])
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        [hook_config] = objects(rendered["cert-manager"], kind)
        assert hook_config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
            "admit-guard/admit-guard-serving"
        )
    [certificate] = objects(rendered["cert-manager"], "Certificate")
    assert "admit-guard.admit-guard.svc" in certificate["spec"]["dnsNames"]


def test_rbac_is_read_only_cluster_wide_and_leases_only_in_the_guards_namespace(rendered):
    docs = rendered["self-signed"]
    [role] = objects(docs, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices", "resourceclaims", "deviceclasses", "devicetaintrules"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["topology.node.k8s.io"],
            "resources": ["noderesourcetopologies"],
            "verbs": ["get", "list", "watch"],
        },
    ]
    [leases] = objects(docs, "Role")
    assert leases["metadata"]["namespace"] == "admit-guard"
    # LeaseStore: GET one (get), GET all to collect (list), POST (create), PUT (update), DELETE.
    verbs = ["get", "list", "create", "update", "delete"]
    assert leases["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": verbs}
    ]
    [binding] = objects(docs, "RoleBinding")
    assert binding["roleRef"]["name"] == leases["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "admit-guard", "namespace": "admit-guard"}
    ]


def test_binds_are_checked_fail_open_with_a_short_timeout_outside_system_namespaces(rendered):
    [config] = objects(rendered["self-signed"], "ValidatingWebhookConfiguration")
    bindings = next(h for h in config["webhooks"] if h["name"] == "bindings.admit-guard.io")
    assert bindings["failurePolicy"] == "Ignore" and bindings["timeoutSeconds"] <= 5
    assert bindings["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods/binding", "bindings"],
        }
    ]
    excluded = bindings["namespaceSelector"]["matchExpressions"][0]["values"]
    assert {"kube-system", "admit-guard"} <= set(excluded)
    [deployment] = objects(rendered["self-signed"], "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["ADMIT_GUARD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_deployment_is_redundant_locked_down_and_probed(rendered):
    docs = rendered["self-signed"]
    [deployment] = objects(docs, "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert deployment["spec"]["replicas"] >= 2
    assert spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert objects(docs, "PodDisruptionBudget")[0]["spec"]["minAvailable"] == 1
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert spec["priorityClassName"]


def test_static_policies_overlay_holds_the_rendered_vap(rendered):
    committed = list(
        yaml.safe_load_all((DEPLOY / "overlays" / "static-policies" / "policies.yaml").read_text())
    )
    assert committed == render(load_config(DEPLOY / "base" / "config.yaml"))
    kinds = {d["kind"] for d in rendered["static-policies"]}
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds


def test_vap_actions_follow_the_mode():
    for mode, actions in {"enforce": ["Deny"], "warn": ["Warn"], "audit": ["Audit"], "fix": ["Deny"]}.items():
        binding = render(config_from_dict({"policies": {"pinnedNodeName": {"mode": mode}}}))[1]
        assert binding["spec"]["validationActions"] == actions
    assert render(config_from_dict({"policies": {"pinnedNodeName": {"mode": "off"}}})) == []


@pytest.mark.parametrize("excluded", [[], ["kube-system"]])
def test_vap_namespace_selector_has_no_empty_value_list(excluded):
    config = config_from_dict({"excludedNamespaces": excluded})
    binding = render(config)[1]
    expressions = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    # The API server rejects In/NotIn with no values.
    assert all(e["values"] for e in expressions if e["operator"] in ("In", "NotIn"))
    names = [e["values"] for e in expressions if e["key"] == "kubernetes.io/metadata.name"]
    assert names == ([excluded] if excluded else [])
    assert expressions[-1] == {"key": "admit-guard.io/skip", "operator": "NotIn", "values": ["true"]}
    pinned = {**PINNED_IN, "metadata": {"name": "d", "namespace": "kube-system"}}
    assert vap_flags(config, pinned, None, "CREATE") is not excluded


def cel_allows(policy: dict, obj: dict, old: dict | None, operation: str, namespace: str, user, groups):
    """Evaluate a rendered policy the way the API server does: match conditions, variables,
    then validations."""
    spec = policy["spec"]
    env = celpy.Environment()
    user_info = {"username": user, "groups": groups}
    request = {"operation": operation, "namespace": namespace, "userInfo": user_info}
    activation = {
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel(request),
    }
    for condition in spec.get("matchConditions", []):
        if not env.program(env.compile(condition["expression"])).evaluate(activation):
            return True  # the policy does not apply
    variables: dict = {}
    for variable in spec["variables"]:
        program = env.program(env.compile(variable["expression"]))
        variables[variable["name"]] = program.evaluate({**activation, "variables": celpy.json_to_cel({})})
    activation["variables"] = celpy.celtypes.MapType(
        {celpy.celtypes.StringType(k): v for k, v in variables.items()}
    )
    return all(env.program(env.compile(v["expression"])).evaluate(activation) for v in spec["validations"])


def vap_flags(config: Config, obj: dict, old: dict | None, operation: str, user="", groups=()) -> bool:
    """Whether the rendered policy and binding would act on (deny, warn, audit) this request."""
    rendered = render(config)
    if not rendered:
        return False
    policy, binding = rendered
    namespace = obj.get("metadata", {}).get("namespace") or "default"
    *excluded, opt_out = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert opt_out == {"key": "admit-guard.io/skip", "operator": "NotIn", "values": ["true"]}
    if any(namespace in e["values"] for e in excluded):
        return False
    return not cel_allows(policy, obj, old, operation, namespace, user, list(groups))


def _policy_cases():
    for path in sorted((ROOT / "tests" / "policy").glob("*.test.yaml")):
        test_file = load_test_file(path)
        for case in test_file.cases:
            shape = pod_shape(case.obj)
            if shape is not None and shape.is_template:
                yield pytest.param(case, id=f"{path.stem}:{case.name}")


@pytest.mark.parametrize("case", list(_policy_cases()))
def test_cel_policy_gives_the_engine_verdict_on_the_project_policy_cases(case):
    decision = evaluate(
        case.obj,
        case.operation,
        None,
        case.config,
        old_object=case.old_object,
        user=case.user,
        groups=case.groups,
    )
    findings = [*decision.violations, *decision.audited, *decision.fixed]
    engine_flags = any(v.reason == "PinnedNodeName" for v in findings) or any(
        w.startswith("[pinnedNodeName]") for w in decision.warnings
    )
    flags = vap_flags(case.config, case.obj, case.old_object, case.operation, case.user, case.groups)
    assert flags is engine_flags


def test_pods_wait_for_endpoint_removal_before_draining(rendered):
    [deployment] = objects(rendered["self-signed"], "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "10"]
    # preStop, then gunicorn's graceful drain (25 s), must fit before the kill.
    assert pod["terminationGracePeriodSeconds"] >= 10 + 25


def test_the_network_policy_overlay_admits_only_the_webhook_port(rendered):
    [policy] = objects(rendered["network-policy"], "NetworkPolicy")
    [deployment] = objects(rendered["network-policy"], "Deployment")
    assert policy["metadata"]["namespace"] == "admit-guard"
    assert policy["spec"]["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8443}] and "from" not in rule
    assert not objects(rendered["self-signed"], "NetworkPolicy")  # optional


EXEMPTIONS = {
    "exemptions": [
        {"namespaces": ["gpu-*"], "users": ["system:serviceaccount:gpu-reservation:*"]},
        {"groups": ["platform-admins"]},
        {"users": ["ci@example.com"], "policies": ["deviceScheduler"]},  # not this policy
    ]
}
PINNED_IN = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "d", "namespace": "gpu-reservation"},
    "spec": {"template": {"spec": {"nodeName": "n1", "containers": [{"name": "a", "image": "a"}]}}},
}


@pytest.mark.parametrize(
    ("namespace", "user", "groups"),
    [
        ("gpu-reservation", "system:serviceaccount:gpu-reservation:holder", ()),
        ("gpu-reservation", "jane", ()),
        ("gpu-x", "system:serviceaccount:gpu-reservation:a.b", ()),
        ("web", "system:serviceaccount:gpu-reservation:holder", ()),
        ("web", "jane", ("platform-admins",)),
        ("web", "jane", ("developers",)),
        ("web", "ci@example.com", ()),
    ],
)
def test_rendered_exemptions_match_the_engines(namespace, user, groups):
    config = config_from_dict(EXEMPTIONS)
    obj = {**PINNED_IN, "metadata": {"name": "d", "namespace": namespace}}
    decision = evaluate(obj, "CREATE", None, config, user=user, groups=groups)
    engine_flags = any(v.reason == "PinnedNodeName" for v in decision.violations)
    assert vap_flags(config, obj, None, "CREATE", user, groups) is engine_flags


def test_vap_refuses_an_exemption_it_cannot_express(tmp_path):
    from click.testing import CliRunner

    from webhook.cli import main

    config = tmp_path / "guard.yaml"
    config.write_text('exemptions: [{users: ["o\'brien"]}]\n')
    result = CliRunner().invoke(main, ["vap", "--config", str(config)])
    assert result.exit_code == 2 and "exemptions[0].users" in result.stderr


@pytest.mark.parametrize(
    "hook", ["pods.admit-guard.io", "bindings.admit-guard.io", "resourceclaims.admit-guard.io"]
)
def test_every_webhook_whose_requests_coordinate_times_out_after_the_decisions_budget(rendered, hook):
    """Pinned pod CREATEs, binds and DRA allocations wait for siblings and round-trip to Leases.
    The guard answers before the API server gives up on it (an answer after the timeout is the
    failurePolicy: Ignore, unchecked): the budget ends every decision, with a second to spare
    for TLS, reading the review and writing the answer."""
    [config] = objects(rendered["self-signed"], "ValidatingWebhookConfiguration")
    [webhook] = [h for h in config["webhooks"] if h["name"] == hook]
    shipped = load_config("deploy/base/config.yaml")
    for settings in (ReservationsConfig(), shipped.node_admission.reservations):
        assert webhook["timeoutSeconds"] >= settings.budget_seconds + 1
        assert settings.wait_seconds + 2 * settings.deadline_seconds <= settings.budget_seconds


def test_dra_allocations_are_checked_fail_open_on_resourceclaim_status_updates_only(rendered):
    [config] = objects(rendered["self-signed"], "ValidatingWebhookConfiguration")
    claims = next(h for h in config["webhooks"] if h["name"] == "resourceclaims.admit-guard.io")
    assert claims["failurePolicy"] == "Ignore" and claims["timeoutSeconds"] <= 5
    assert claims["rules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["v1"],
            "operations": ["UPDATE"],
            "resources": ["resourceclaims/status"],
        }
    ]
    assert claims["sideEffects"] == "NoneOnDryRun"


def test_the_metrics_and_the_reservation_table_have_their_own_size_limited_volumes(rendered):
    [deployment] = objects(rendered["self-signed"], "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    [container] = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    metrics, table = mounts[env["PROMETHEUS_MULTIPROC_DIR"]], mounts["/tmp"]  # serve's table lives in /tmp
    assert metrics != table
    for name in (metrics, table):
        assert volumes[name]["emptyDir"]["sizeLimit"]
        assert volumes[name]["emptyDir"]["medium"] == "Memory"  # full means ENOSPC, not an eviction


def test_the_client_auth_overlay_requires_the_api_servers_certificate(rendered):
    [deployment] = objects(rendered["client-auth"], "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert "--client-ca=/etc/admit-guard/client-ca/client-ca.crt" in container["args"]
    assert "--client-cn=kube-apiserver" in container["args"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "client-ca")
    assert mount["mountPath"] == "/etc/admit-guard/client-ca"
    volume = next(v for v in spec["volumes"] if v["name"] == "client-ca")
    [config_map] = [c for c in objects(rendered["client-auth"], "ConfigMap") if "client-ca.crt" in c["data"]]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert config_map["metadata"]["namespace"] == "admit-guard"
    # The kubelet's probes present no certificate: they stay on paths that need none.
    assert {
        container["livenessProbe"]["httpGet"]["path"],
        container["readinessProbe"]["httpGet"]["path"],
    } == {
        "/healthz",
        "/readyz",
    }


def test_every_built_in_workload_kind_reaches_the_validating_and_the_mutating_webhooks(rendered):
    from webhook.kube.workloads import BUILT_IN

    docs = rendered["self-signed"]
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        [hooks] = objects(docs, kind)
        covered = {
            (group, resource)
            for hook in hooks["webhooks"]
            for rule in hook["rules"]
            if set(rule["operations"]) == {"CREATE", "UPDATE"}
            for group in rule["apiGroups"]
            for resource in rule["resources"]
        }
        for workload in BUILT_IN.kinds:
            assert (workload.group, f"{workload.kind.lower()}s") in covered, (kind, workload.kind)
