"""The API server's own fields decide what is judged; an unreadable field fails open only for
the checks that need it; malformed objects are field errors, never tracebacks."""

from __future__ import annotations

import base64
import json
import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.app import example, make_client, post

STRICT = {"failOpen": False}
FIX = {"policies": {"pinnedNodeName": {"mode": "fix"}}}


def pinned_deployment() -> dict:
    return example("incident-1-pinned-deployment")


def _template(review: dict) -> dict:
    return review["request"]["object"]["spec"]["template"]["spec"]


def test_the_request_kind_decides_not_the_objects_own_kind():
    review = pinned_deployment()
    review["request"]["object"]["kind"] = "deployment"
    review["request"]["object"]["apiVersion"] = "example.com/v1"
    response = post(make_client(), "validate", review)
    assert response["allowed"] is False and response["status"]["reason"] == "PinnedNodeName"


def test_the_request_namespace_decides_exemptions_not_the_objects_own():
    review = pinned_deployment()
    review["request"]["object"]["metadata"]["namespace"] = "kube-system"
    response = post(make_client({"excludedNamespaces": ["kube-system"]}), "validate", review)
    assert response["allowed"] is False
    assert "Deployment edge/sensor-ingest" in response["status"]["message"]


def test_a_request_in_an_excluded_namespace_is_allowed_whatever_the_object_says():
    review = pinned_deployment()
    review["request"]["namespace"] = "kube-system"
    review["request"]["object"]["metadata"]["namespace"] = "edge"
    response = post(make_client({"excludedNamespaces": ["kube-system"]}), "validate", review)
    assert response == {"uid": review["request"]["uid"], "allowed": True}


def test_sub_resource_requests_are_not_judged_as_new_pods():
    review = example("pod-host-port-conflict")
    review["request"].update(operation="UPDATE", subResource="status")
    review["request"]["oldObject"] = review["request"]["object"]
    assert post(make_client(), "validate", review)["allowed"] is True


@pytest.mark.parametrize("config", [{}, STRICT])
def test_a_pinned_template_is_denied_whatever_its_requests_say(config):
    review = pinned_deployment()
    _template(review)["containers"][0]["resources"]["requests"]["cpu"] = "two"
    response = post(make_client(config), "validate", review)
    assert response["allowed"] is False
    assert response["status"]["reason"].startswith("PinnedNodeName")
    assert "requests.cpu" in response["status"]["message"]


def test_fix_mode_repairs_a_pinned_template_with_an_unreadable_request():
    review = pinned_deployment()
    _template(review)["containers"][0]["resources"]["requests"]["cpu"] = "two"
    response = post(make_client(FIX), "mutate", review)
    patch = json.loads(base64.b64decode(response["patch"]))
    assert {"op": "remove", "path": "/spec/template/spec/nodeName"} in patch


def test_an_unreadable_request_without_a_pinned_node_fails_open_with_a_warning_naming_the_field():
    review = example("good-deployment") if _has("good-deployment") else pinned_deployment()
    _template(review).pop("nodeName", None)
    _template(review)["containers"][0]["resources"]["requests"]["cpu"] = "two"
    response = post(make_client(), "validate", review)
    assert response["allowed"] is True
    assert "spec.template.spec.containers[0].resources.requests.cpu" in response["warnings"][0]
    strict = post(make_client(STRICT), "validate", review)
    assert strict["allowed"] is False and strict["status"]["code"] == 422


def test_exponent_quantities_the_api_server_accepts_are_judged_as_huge():
    review = pinned_deployment()
    _template(review)["containers"][0]["resources"]["requests"]["cpu"] = "1e31"
    response = post(make_client(), "validate", review)
    assert "OutOfcpu" in response["status"]["message"]
    fixed = post(make_client(FIX), "mutate", review)
    assert "patch" in fixed


def _has(name: str) -> bool:
    try:
        example(name)
    except FileNotFoundError:
        return False
    return True


def _deep(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


@pytest.mark.parametrize("field", ["extra", "affinity", "tolerations", "securityContext"])
@pytest.mark.parametrize("endpoint", ["validate", "mutate"])
def test_a_deeply_nested_object_is_a_field_error_without_a_traceback(endpoint, field, caplog):
    review = pinned_deployment()
    _template(review)[field] = "DEEP"  # a field no check reads (only the patch copies it), and ones they do
    body = json.dumps(review).replace('"DEEP"', _deep(1000))
    with caplog.at_level(logging.WARNING):
        reply = make_client(FIX).post(f"/{endpoint}", data=body, content_type="application/json")
    assert reply.status_code == 200
    assert not [r for r in caplog.records if r.exc_info]


MALFORMED = st.sampled_from([5, "x", [], [1], True, None, {"a": []}])
PATHS = [
    ("metadata",),
    ("spec",),
    ("spec", "template"),
    ("spec", "template", "metadata"),
    ("spec", "template", "metadata", "annotations"),
    ("spec", "template", "spec"),
    ("spec", "template", "spec", "containers"),
    ("spec", "template", "spec", "containers", 0),
    ("spec", "template", "spec", "containers", 0, "resources"),
    ("spec", "template", "spec", "containers", 0, "resources", "requests"),
    ("spec", "template", "spec", "tolerations"),
    ("spec", "template", "spec", "affinity"),
    ("spec", "template", "spec", "nodeSelector"),
    ("spec", "template", "spec", "nodeName"),
]


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), value=MALFORMED, endpoint=st.sampled_from(["validate", "mutate"]))
def test_malformed_objects_are_answered_without_a_traceback(path, value, endpoint, caplog):
    review = pinned_deployment()
    target = review["request"]["object"]
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        response = post(make_client(FIX), endpoint, review)
    assert isinstance(response["allowed"], bool)
    assert not [r for r in caplog.records if r.exc_info], caplog.text
