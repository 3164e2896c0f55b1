"""Every route of the shipped webhooks reaches the guard: for each resource of each rule of each
webhook in deploy/, a request through the API double is refused (or repaired) by the running
guard with its reason, and the same request with only that resource taken out of that rule is
admitted untouched. A rule that routes to the wrong path, a resource misspelt, or a kind whose
template the guard looks for in the wrong place fails here.

One guard for the module (one replica of two workers) with ``pinnedNodeName`` and
``deviceScheduler`` in ``fix`` mode, so the mutating webhook has something to repair; the
validating routes are checked with the mutating configuration left out (a fixable object that
reaches ``/validate`` unrepaired is denied, docs/serving.md). Needs ``kubectl`` to render
deploy/.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.helpers.cluster import deploy
from tests.helpers.cluster.apiserver import ApiDouble, fresh_cluster
from tests.helpers.cluster.guard import Guard, enforcing
from tests.helpers.cluster.routes import (
    KINDS,
    Route,
    holding,
    shipped_routes,
    store_name,
    template_in,
    validating_only,
    without,
)
from tests.helpers.cluster.scenarios import GPU, claim, node, pod, pod_spec, resource_slice
from tests.helpers.cluster.webhooks import Denied, Dispatcher
from tests.helpers.fake_apiserver import FakeApiServer

USER = {"username": "jane", "groups": ["system:authenticated"]}
SCHEDULER = {"username": "system:kube-scheduler", "groups": ["system:authenticated"]}
FULL, GPU_NODE, DRA_NODE = "full-1", "gpu-1", "dra-1"
ROUTES = shipped_routes()
needs_kubectl = pytest.mark.skipif(deploy.kubectl() is None, reason="kubectl renders deploy/ (kustomize)")


def test_every_shipped_route_has_a_request_that_reaches_it():
    """A rule added to deploy/ without a kind here fails: every route must be proven below."""
    workload_routes = [r for r in ROUTES if r.resource not in ("pods", "pods/binding", "bindings",
                                                                "resourceclaims/status")]  # fmt: skip
    assert {(r.group, r.resource) for r in workload_routes} <= set(KINDS)
    assert len({r.webhook for r in ROUTES}) == 7 and len(ROUTES) > 60


# -- the cluster the guard watches ------------------------------------------------------------


@dataclass
class Cluster:
    api: ApiDouble
    configurations: list[dict[str, Any]]
    guard: Guard

    def through(self, configurations: list[dict[str, Any]]) -> ApiDouble:
        if self.api.dispatcher is not None:
            self.api.dispatcher.close()
        self.api.dispatcher = Dispatcher(configurations, self.guard.endpoints, self.api.namespace_labels)
        return self.api


def _state() -> dict[str, list[dict[str, Any]]]:
    """A cpu-full node, a GPU node whose devices volcano owns, a DRA node whose one device a
    running pod's claim holds, and unbound pods for the binding routes to bind."""
    hog = pod("hog", pod_spec({"cpu": "4"}, nodeName=FULL), wanted=False, phase="Running")
    claims = [{"name": "gpu", "resourceClaimName": "held"}]
    spec = pod_spec({"cpu": "1"}, nodeName=DRA_NODE, resourceClaims=claims)
    holder = pod("holder", spec, namespace="ml", wanted=False, phase="Running")
    unbound = [
        pod(f"unbound-{name}-{tag}", pod_spec({"cpu": "1"}), wanted=False, phase="Pending")
        for name in ("binding", "bindings")
        for tag in ("a", "b")
    ]
    return {
        "nodes": [node(FULL), node(GPU_NODE, cpu="16", **{GPU: "2"}), node(DRA_NODE, cpu="16")],
        "pods": [hog, holder, *unbound],
        "resourceslices": [resource_slice(DRA_NODE, ["gpu-0"])],
        "resourceclaims": [
            claim("held", DRA_NODE, "gpu-0", pod_name="holder"),
            *(claim(f"pending-{tag}") for tag in ("a", "b")),
        ],
    }


def _config(rendered: deploy.Rendered) -> dict[str, Any]:
    config = enforcing(rendered.config())
    policies = config["policies"]
    policies["pinnedNodeName"] = {**policies["pinnedNodeName"], "mode": "fix"}
    policies["deviceScheduler"] = {**policies["deviceScheduler"], "mode": "fix", "owners": {GPU: "volcano"}}
    return config


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    if deploy.kubectl() is None:
        pytest.skip("kubectl renders deploy/ (kustomize)")
    workdir = tmp_path_factory.mktemp("routes")
    rendered = deploy.render(workdir)
    store = fresh_cluster(watch_lag=0.0)
    api = ApiDouble(store)
    for namespace in ("default", "ml", "kube-system", "admit-guard"):
        api.add_namespace(namespace)
    for resource, objects in _state().items():
        api.load(resource, objects)
    for (group, resource), kind in KINDS.items():
        if store_name(group, resource) not in api.resources:
            api.install(store_name(group, resource), kind.resource)
    with contextlib.ExitStack() as stack:
        server = FakeApiServer(store)
        stack.callback(server.close)
        guard = Guard(rendered, server.kubeconfig(workdir / "kubeconfig"), workdir, _config(rendered),
                      replicas=1)  # fmt: skip
        guard.start()
        stack.callback(guard.stop)
        cluster = Cluster(api, rendered.webhook_configurations(), guard)
        yield cluster
        if api.dispatcher is not None:
            api.dispatcher.close()


# -- one request per route ----------------------------------------------------------------------


def _name(route: Route, tag: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", f"{route.id}-{tag}".lower()).strip("-")


def _template(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "routes"}}, "spec": {"restartPolicy": "Never", **spec}}


def _pinned(route: Route, tag: str) -> tuple[str, dict[str, Any]]:
    spec = pod_spec({"cpu": "1"}, nodeName=FULL)
    obj = holding(route.group, route.resource, _name(route, tag), "default", _template(**spec))
    return store_name(route.group, route.resource), obj


def _gpu_template(route: Route, tag: str) -> tuple[str, dict[str, Any]]:
    spec = pod_spec({GPU: "1"})  # default-scheduler, on devices volcano owns
    obj = holding(route.group, route.resource, _name(route, tag), "default", _template(**spec))
    return store_name(route.group, route.resource), obj


def _attempt(api: ApiDouble, route: Route, tag: str) -> dict[str, Any]:
    """The request only ``route`` sends to the guard; the stored object (``Denied`` if refused)."""
    if route.resource in ("pods/binding", "bindings"):
        pod_name = f"unbound-{route.resource.split('/')[-1]}-{tag}"
        current = api.get("pods", "default", pod_name)
        legacy = route.resource == "bindings"
        api.bind("default", pod_name, current["metadata"]["uid"], FULL, SCHEDULER, legacy=legacy)
        return api.get("pods", "default", pod_name)
    if route.resource == "resourceclaims/status":
        pending = api.get("resourceclaims", "ml", f"pending-{tag}")
        held = api.get("resourceclaims", "ml", "held")
        late = {"resource": "pods", "name": "late", "uid": "pods-late"}
        pending["status"] = {"allocation": held["status"]["allocation"], "reservedFor": [late]}
        return api.update("resourceclaims", pending, SCHEDULER, subresource="status")
    if route.resource == "pods":
        if route.mutating:  # deviceScheduler's fix: the owner of the devices schedules the pod
            return api.create("pods", pod(_name(route, tag), pod_spec({GPU: "1"}), wanted=False), USER)
        return api.create(
            "pods", pod(_name(route, tag), pod_spec({"cpu": "1"}, nodeName=FULL), wanted=False), USER
        )
    if route.webhook.startswith("workloads."):
        return api.create(*_gpu_template(route, tag), USER)
    return api.create(*_pinned(route, tag), USER)


# What the guard says through each validating webhook, by the request above.
REASONS = {
    "pinned-templates.admit-guard.io": "PinnedNodeName",
    "workloads.admit-guard.io": "MixedDeviceScheduler",
    "custom-workloads.admit-guard.io": "PinnedNodeName",
    "pods.admit-guard.io": "OutOfcpu",
    "bindings.admit-guard.io": "OutOfcpu",
    "resourceclaims.admit-guard.io": "DeviceAlreadyAllocated",
}


def _repaired(route: Route, stored: dict[str, Any]) -> bool:
    if route.resource == "pods":
        return stored["spec"]["schedulerName"] == "volcano"
    template = template_in(stored, route.group, route.resource)
    return "nodeName" not in template["spec"]


VALIDATING = [r for r in ROUTES if not r.mutating]
MUTATING = [r for r in ROUTES if r.mutating]


@needs_kubectl
@pytest.mark.parametrize("route", VALIDATING, ids=[r.id for r in VALIDATING])
def test_a_validating_route_is_what_brings_the_request_to_the_guard(cluster, route):
    shipped = validating_only(cluster.configurations)
    with pytest.raises(Denied) as refused:
        _attempt(cluster.through(shipped), route, "a")
    assert f'admission webhook "{route.webhook}" denied the request' in refused.value.message
    assert REASONS[route.webhook] in refused.value.reason + refused.value.message
    admitted = _attempt(cluster.through(without(shipped, route)), route, "b")
    assert admitted is not None


@needs_kubectl
@pytest.mark.parametrize("route", MUTATING, ids=[r.id for r in MUTATING])
def test_a_mutating_route_is_what_brings_the_repair(cluster, route):
    repaired = _attempt(cluster.through(cluster.configurations), route, "a")
    assert _repaired(route, repaired), repaired
    # Without the route the object reaches the validating webhooks unrepaired, and is refused.
    with pytest.raises(Denied) as refused:
        _attempt(cluster.through(without(cluster.configurations, route)), route, "b")
    assert "PinnedNodeName" in refused.value.message or "MixedDeviceScheduler" in refused.value.message


def test_taking_a_route_out_leaves_every_other_route_in_place():
    rules = [{"resources": ["pods", "pods/binding"]}, {"resources": ["pods"]}]
    shipped = [{"kind": "ValidatingWebhookConfiguration", "webhooks": [{"name": "a", "rules": rules}]}]
    changed = without(shipped, Route("a", 0, "", "pods/binding", mutating=False))
    assert changed[0]["webhooks"][0]["rules"] == [{"resources": ["pods"]}, {"resources": ["pods"]}]
    assert rules[0]["resources"] == ["pods", "pods/binding"]  # the configuration given is a copy


def test_the_kinds_put_their_templates_where_their_api_types_keep_them():
    volcano = holding("batch.volcano.sh", "jobs", "j", "default", {"spec": {}})
    assert volcano["spec"]["tasks"][0]["template"] == {"spec": {}}
    runtime = holding("trainer.kubeflow.org", "clustertrainingruntimes", "r", "default", {"spec": {}})
    assert "namespace" not in runtime["metadata"]
    assert template_in(runtime, "trainer.kubeflow.org", "clustertrainingruntimes") == {"spec": {}}


# -- how the double calls the webhooks ----------------------------------------------------------


@needs_kubectl
def test_the_double_keeps_its_webhook_connections_alive_as_the_api_server_does(cluster):
    api = cluster.through(validating_only(cluster.configurations))
    for i in range(5):
        api.create("pods", pod(f"kept-alive-{i}", pod_spec({"cpu": "1"}), wanted=False), USER)
    assert len([c for c in api.dispatcher.calls if c.webhook == "pods.admit-guard.io"]) == 5
    assert api.dispatcher.connects == 1  # one connection, this thread's, for the pods webhook


@needs_kubectl
def test_a_request_past_the_api_servers_timeout_is_answered_504_whatever_the_failure_policy(cluster):
    api = cluster.through(validating_only(cluster.configurations))
    api.dispatcher.request_timeout = 1e-9  # passed before the first call
    with pytest.raises(Denied) as timed_out:
        api.create("pods", pod("too-late", pod_spec({"cpu": "1"}), wanted=False), USER)
    assert (timed_out.value.code, timed_out.value.reason) == (504, "Timeout")
    assert api.get("pods", "default", "too-late") is None
