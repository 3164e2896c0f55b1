"""The webhook app in-process: the AdmissionReview contract, modes, bad input, metrics, logs."""

from __future__ import annotations

import base64
import io
import json
import logging

import jsonpatch
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.app import CLUSTER, example, make_client, post
from tests.helpers.live_server import metric_sum
from tests.helpers.paths import EXAMPLES
from webhook.allocation import AllocationGuard
from webhook.binding import BindGuard
from webhook.config import config_from_dict
from webhook.coordination.allocations import pool_table
from webhook.coordination.reservations import node_table
from webhook.serve.app import DECISION_LOG, create_app
from webhook.state.source import FixedState


@pytest.fixture
def client():
    return make_client()


def test_admission_examples_match_the_workload_manifests():
    for review_file in sorted((EXAMPLES / "admission").glob("*.json")):
        review = json.loads(review_file.read_text())
        if review["request"].get("subResource"):
            continue  # a bind or a status write: its object is no workload manifest
        manifest = yaml.safe_load((EXAMPLES / "workloads" / f"{review_file.stem}.yaml").read_text())
        assert review["request"]["object"] == manifest, review_file.name


# Reviews of a subresource, and what the server says of them on the example cluster.
SUBRESOURCE_EXAMPLES = {
    "binding-notebook-to-volcano-gpu-node": ["MixedDeviceScheduler", "OutOfnvidia.com/gpu"],
    "resourceclaim-status-device-taken": ["DeviceAlreadyAllocated"],
}


@pytest.mark.parametrize("name", sorted(SUBRESOURCE_EXAMPLES))
def test_the_bind_and_claim_status_examples_get_their_verdict_from_the_server_as_served(tmp_path, name):
    """The examples a ``make run`` user posts: the server built as ``serve`` builds it (a bind
    guard and an allocation guard) on the bundled cluster."""
    config = config_from_dict({})
    app = create_app(
        config,
        FixedState(CLUSTER),
        bind_guard=BindGuard(config, node_table(tmp_path / "binds")),
        allocation_guard=AllocationGuard(config, pool_table(tmp_path / "allocations")),
    )
    response = post(app.test_client(), "validate", example(name))
    assert response["allowed"] is False, response
    assert response["status"]["reason"].split(",") == SUBRESOURCE_EXAMPLES[name], response["status"]


def test_validate_denies_a_pinned_deployment_with_403_and_the_full_message(client):
    response = post(client, "validate", example("incident-1-pinned-deployment"))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["reason"] == "PinnedNodeName"
    assert "edge-1" in response["status"]["message"]
    assert "OutOfpods" in response["status"]["message"]


def test_denial_message_numbers_every_violation(client):
    response = post(client, "validate", example("pod-pinned-to-full-gpu-node"))
    status = response["status"]
    assert status["reason"] == "MixedDeviceScheduler,OutOfnvidia.com/gpu"
    assert "(1) MixedDeviceScheduler:" in status["message"]
    assert "(2) OutOfnvidia.com/gpu:" in status["message"]


def test_validate_allows_a_good_workload_without_status_or_patch(client):
    response = post(client, "validate", example("good-deployment"))
    assert response == {"uid": response["uid"], "allowed": True}


def test_warn_mode_allows_with_warnings_kubectl_prints(client):
    client = make_client({"policies": {"deviceScheduler": {"mode": "warn"}}})
    response = post(client, "validate", example("incident-2-mixed-scheduler-job"))
    assert response["allowed"] is True
    assert any("MixedDeviceScheduler" in w for w in response["warnings"])


def test_audit_mode_allows_silently_but_counts_the_finding():
    client = make_client({"policies": {"pinnedNodeName": {"mode": "audit"}}})
    response = post(client, "validate", example("incident-1-pinned-deployment"))
    assert response == {"uid": response["uid"], "allowed": True}
    assert _sample(client, "admit_guard_violations_total", outcome="audited", reason="PinnedNodeName") == 1


def test_mutate_patch_rewrites_node_name_into_node_affinity():
    client = make_client({"policies": {"pinnedNodeName": {"mode": "fix"}}})
    review = example("incident-1-pinned-deployment")
    response = post(client, "mutate", review)
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    patched = jsonpatch.apply_patch(
        review["request"]["object"], json.loads(base64.b64decode(response["patch"]))
    )
    spec = patched["spec"]["template"]["spec"]
    assert "nodeName" not in spec
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["edge-1"]
    assert any("fixed PinnedNodeName" in w for w in response["warnings"])
    # The validating webhook then sees the repaired object and allows it.
    review["request"]["object"] = patched
    assert post(client, "validate", review)["allowed"] is True


def test_fixable_object_that_reaches_validate_unrepaired_is_denied():
    client = make_client({"policies": {"pinnedNodeName": {"mode": "fix"}}})
    response = post(client, "validate", example("incident-1-pinned-deployment"))
    assert response["allowed"] is False
    assert "mutating webhook did not repair" in response["status"]["message"]


def test_mutate_never_denies_and_never_sends_an_empty_patch(client):
    for name in ("incident-1-pinned-deployment", "good-deployment"):
        response = post(client, "mutate", example(name))
        assert response == {"uid": response["uid"], "allowed": True}


def test_update_that_keeps_an_existing_pin_follows_the_update_rule(client):
    review = example("incident-1-pinned-deployment")
    review["request"]["operation"] = "UPDATE"
    review["request"]["oldObject"] = review["request"]["object"]
    create = post(client, "validate", example("incident-1-pinned-deployment"))
    update = post(client, "validate", review)
    assert create["allowed"] is False
    assert update != create  # the pinnedNodeName UPDATE rule judges old and new together


def test_excluded_namespace_is_allowed_untouched():
    client = make_client({"excludedNamespaces": ["edge"]})
    for endpoint in ("validate", "mutate"):
        response = post(client, endpoint, example("incident-1-pinned-deployment"))
        assert response == {"uid": response["uid"], "allowed": True}


def test_namespace_from_the_request_applies_when_the_object_has_none():
    client = make_client({"excludedNamespaces": ["edge"]})
    review = example("incident-1-pinned-deployment")
    del review["request"]["object"]["metadata"]["namespace"]
    assert post(client, "validate", review)["allowed"] is True


def test_dry_run_gets_the_same_verdict_but_counts_no_violation(client):
    review = example("incident-1-pinned-deployment")
    review["request"]["dryRun"] = True
    assert post(client, "validate", review)["allowed"] is False
    assert _sample(client, "admit_guard_violations_total", reason="PinnedNodeName") == 0
    assert _sample(client, "admit_guard_requests_total", verdict="deny") == 1


def test_delete_and_connect_are_allowed_without_an_object(client):
    review = example("good-deployment")
    review["request"].update(operation="DELETE", object=None, oldObject=review["request"]["object"])
    assert post(client, "validate", review)["allowed"] is True


def test_malformed_quantity_is_allowed_with_a_warning_when_failing_open(client):
    review = _with_bad_quantity(example("good-deployment"))
    response = post(client, "validate", review)
    assert response["allowed"] is True
    assert "spec.template.spec.containers[0].resources.requests.cpu" in response["warnings"][0]


def test_malformed_quantity_is_denied_with_the_parse_error_when_failing_closed():
    client = make_client({"failOpen": False})
    response = post(client, "validate", _with_bad_quantity(example("good-deployment")))
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    assert "spec.template.spec.containers[0].resources.requests.cpu" in response["status"]["message"]


def _nested_past_the_parsers_limit(review: dict) -> bytes:
    """The review with 1,100 nested lists in the pod template: orjson reads at most 1,024."""
    review["request"]["object"]["spec"]["template"]["spec"]["extra"] = "DEEP"
    return json.dumps(review).encode().replace(b'"DEEP"', b"[" * 1100 + b"]" * 1100)


def test_json_nested_past_the_parsers_limit_is_answered_per_fail_open_not_400(client):
    body = _nested_past_the_parsers_limit(example("good-deployment"))
    reply = client.post("/validate", data=body, content_type="application/json")
    assert reply.status_code == 200
    response = reply.get_json()["response"]
    assert response["allowed"] is True
    assert "spec.template.spec.extra[]" in response["warnings"][0] and "nested" in response["warnings"][0]
    closed = make_client({"failOpen": False}).post("/validate", data=body, content_type="application/json")
    assert closed.get_json()["response"]["status"]["code"] == 422


def test_json_nested_past_the_parsers_limit_cannot_hide_a_pinned_template(client):
    body = _nested_past_the_parsers_limit(example("incident-1-pinned-deployment"))
    response = client.post("/validate", data=body, content_type="application/json").get_json()["response"]
    assert response["allowed"] is False and "PinnedNodeName" in response["status"]["reason"]


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (b"not json", "not JSON"),
        (b"[]", "JSON object"),
        (b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}', "apiVersion"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}', "kind"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "request"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}', "request.uid"),
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",'
            b' "request": {"uid": "1", "operation": "CREATE"}}',
            "request.object",
        ),
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",'
            b' "request": {"uid": "1", "operation": "CREATE", "object": {}, "dryRun": "yes"}}',
            "request.dryRun",
        ),
    ],
)
def test_bad_bodies_get_400_naming_the_problem(client, body, names):
    reply = client.post("/validate", data=body, content_type="application/json")
    assert reply.status_code == 400
    assert names in reply.get_json()["error"]


def test_body_over_the_limit_gets_413():
    client = make_client(max_body_bytes=4096)
    review = example("good-deployment")
    review["request"]["object"]["metadata"]["annotations"] = {"padding": "x" * 5000}
    reply = client.post("/validate", json=review)
    assert reply.status_code == 413
    assert "4096" in reply.get_json()["error"]


def test_unknown_paths_and_methods_answer_json_errors(client):
    assert client.get("/nope").get_json()["code"] == 404
    assert client.get("/validate").get_json()["code"] == 405


def test_admission_paths_answer_only_post_and_say_so():
    app = make_client().application
    for method in ("GET", "PUT", "DELETE"):
        status, headers, body = _call(app, "/mutate", b"", method=method)
        assert status.startswith("405") and ("Allow", "POST") in headers and json.loads(body)["code"] == 405


def test_a_chunked_review_is_read_to_its_end_and_judged():
    body = json.dumps(example("incident-1-pinned-deployment")).encode()
    status, _, answer = _call(make_client().application, "/validate", body, length=None, terminated=True)
    assert status.startswith("200") and json.loads(answer)["response"]["allowed"] is False


def test_a_chunked_review_over_the_limit_gets_413():
    app = make_client(max_body_bytes=4096).application
    status, _, answer = _call(app, "/validate", b"x" * 5000, length=None, terminated=True)
    assert status.startswith("413") and "4096" in json.loads(answer)["error"]


def test_a_body_whose_end_the_server_does_not_know_is_not_read():
    # Neither a Content-Length nor an end from the server: reading could wait forever.
    body = json.dumps(example("good-deployment")).encode()
    status, _, answer = _call(make_client().application, "/validate", body, length=None, terminated=False)
    assert status.startswith("400") and "not JSON" in json.loads(answer)["error"]


def _call(app, path: str, body: bytes, *, method="POST", length: int | None = -1, terminated=False):
    """One WSGI call, with the framing a server might give (``length=None``: no Content-Length)."""
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": "",
               "SERVER_NAME": "guard", "SERVER_PORT": "8443", "SERVER_PROTOCOL": "HTTP/1.1",
               "wsgi.url_scheme": "https", "wsgi.input": io.BytesIO(body), "wsgi.errors": io.StringIO(),
               "wsgi.input_terminated": terminated}  # fmt: skip
    if length is not None:
        environ["CONTENT_LENGTH"] = str(len(body) if length < 0 else length)
    started: list = []
    answer = b"".join(app(environ, lambda status, headers: started.extend((status, headers))))
    return started[0], started[1], answer


def test_a_failure_outside_the_decision_is_still_a_json_500(monkeypatch, caplog):
    from webhook.serve import app as serve_app

    def broken(*args):
        raise RuntimeError("metrics file gone")

    monkeypatch.setattr(serve_app, "_record", broken)
    reply = make_client().post("/validate", json=example("good-deployment"))
    assert reply.status_code == 500 and reply.get_json() == {
        "error": "internal error (RuntimeError)",
        "code": 500,
    }
    assert "metrics file gone" in caplog.text


def test_health_and_readiness(client):
    assert client.get("/healthz").status_code == 200
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.get_json()["nodes"] == len(CLUSTER.nodes)


def test_metrics_count_requests_and_expose_state_size_and_age(client):
    post(client, "validate", example("incident-1-pinned-deployment"))
    post(client, "validate", example("good-deployment"))
    assert _sample(client, "admit_guard_requests_total", verdict="deny", kind="Deployment") == 1
    assert _sample(client, "admit_guard_requests_total", verdict="allow") == 1
    assert _sample(client, "admit_guard_decision_seconds_count", endpoint="validate") == 2
    assert _sample(client, "admit_guard_state_objects", kind="node") == len(CLUSTER.nodes)
    assert _sample(client, "admit_guard_state_age_seconds") >= 0


def test_one_json_log_line_per_decision_without_the_object(client):
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    log = logging.getLogger(DECISION_LOG)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        post(client, "validate", example("incident-1-pinned-deployment"))
    finally:
        log.removeHandler(handler)
        log.setLevel(logging.NOTSET)
    [record] = records
    line = json.loads(record.getMessage())
    assert line["verdict"] == "deny" and line["reasons"] == ["PinnedNodeName"]
    assert (line["namespace"], line["name"], line["operation"]) == ("edge", "sensor-ingest", "CREATE")
    assert "registry.example" not in record.getMessage()  # no object body
    assert line["latencyMs"] > 0


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
_quantities = st.sampled_from(["1", "500m", "2Gi", "-1", "1e3", "x", "", "0.5", "1Ki"]) | st.text(max_size=4)
_containers = st.fixed_dictionaries(
    {"name": st.text(max_size=4), "image": st.just("img")},
    optional={
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "requests": st.dictionaries(
                    st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), _quantities
                ),
                "limits": st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), _quantities),
            },
        )
        | _json_values,
        "ports": st.lists(
            st.fixed_dictionaries(
                {"containerPort": st.integers(-1, 70000)}, optional={"hostPort": _json_values}
            )
        ),
        "restartPolicy": st.sampled_from(["Always", "Never", 3]),
    },
)
_pod_specs = st.fixed_dictionaries(
    {"containers": st.lists(_containers, max_size=3) | _json_values},
    optional={
        "nodeName": st.sampled_from(["edge-1", "gpu-1", "cpu-1", "nowhere"]) | _json_values,
        "schedulerName": st.sampled_from(["volcano", "default-scheduler"]) | _json_values,
        "initContainers": st.lists(_containers, max_size=2),
        "tolerations": _json_values,
        "affinity": _json_values,
        "overhead": st.dictionaries(st.sampled_from(["cpu", "memory"]), _quantities),
        "priority": _json_values,
    },
)
_objects = st.one_of(
    st.fixed_dictionaries(
        {"apiVersion": st.just("v1"), "kind": st.just("Pod"), "spec": _pod_specs | _json_values},
        optional={
            "metadata": st.fixed_dictionaries({}, optional={"name": _json_values, "namespace": _json_values})
        },
    ),
    st.fixed_dictionaries(
        {
            "apiVersion": st.sampled_from(["apps/v1", "batch/v1"]),
            "kind": st.sampled_from(["Deployment", "Job", "StatefulSet", "DaemonSet"]),
            "spec": st.fixed_dictionaries({"template": st.fixed_dictionaries({"spec": _pod_specs})})
            | _json_values,
        }
    ),
    _json_values,
)
_reviews = st.fixed_dictionaries(
    {
        "apiVersion": st.sampled_from(["admission.k8s.io/v1", "admission.k8s.io/v1beta1"]),
        "kind": st.sampled_from(["AdmissionReview", "Pod"]),
        "request": st.fixed_dictionaries(
            {
                "uid": st.text(max_size=6) | _json_values,
                "operation": st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"]) | _json_values,
                "object": _objects,
            },
            optional={
                "oldObject": _objects,
                "namespace": _json_values,
                "dryRun": _json_values,
                "userInfo": _json_values,
                "kind": _json_values,
            },
        )
        | _json_values,
    }
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(review=_reviews, endpoint=st.sampled_from(["validate", "mutate"]), fail_open=st.booleans())
def test_fuzzed_reviews_never_get_a_500_and_every_answer_is_well_formed(review, endpoint, fail_open):
    client = _FUZZ_CLIENTS[fail_open]
    reply = client.post(f"/{endpoint}", json=review)
    assert reply.status_code in (200, 400), reply.get_data(as_text=True)
    body = reply.get_json()
    if reply.status_code == 400:
        assert isinstance(body["error"], str) and body["error"]
        return
    response = body["response"]
    assert response["uid"] == review["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert response["status"]["code"] in (403, 422) and response["status"]["message"]
    assert all(isinstance(w, str) and w for w in response.get("warnings", []))
    if "patch" in response:
        assert endpoint == "mutate" and response["patchType"] == "JSONPatch"
        patch = json.loads(base64.b64decode(response["patch"]))
        assert (
            patch and jsonpatch.apply_patch(review["request"]["object"], patch) != review["request"]["object"]
        )


_FUZZ_CLIENTS = {
    True: make_client({"policies": {"pinnedNodeName": {"mode": "fix"}, "deviceScheduler": {"mode": "fix"}}}),
    False: make_client({"failOpen": False}),
}


def _with_bad_quantity(review: dict) -> dict:
    container = review["request"]["object"]["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {"requests": {"cpu": "two"}}
    return review


def _sample(client, name: str, **labels: str) -> float:
    return metric_sum(client.get("/metrics").get_data(as_text=True), name, **labels)
