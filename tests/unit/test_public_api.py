"""What the package promises: its public names, and the AdmissionReview fields it writes."""

from __future__ import annotations

import subprocess
import sys

import pytest

import webhook
from tests.helpers.app import example, make_client
from webhook.admission import Response, ReviewBody, Status

PUBLIC = ("evaluate", "load_config", "load_snapshot", "create_app", "Decision", "Config", "ClusterState")


def test_the_package_names_its_public_api():
    from webhook.config import Config, load_config
    from webhook.engine import Decision, evaluate
    from webhook.serve.app import create_app
    from webhook.state import ClusterState
    from webhook.state.snapshot import load_snapshot

    defined = (evaluate, load_config, load_snapshot, create_app, Decision, Config, ClusterState)
    assert [getattr(webhook, name) for name in PUBLIC] == list(defined)
    assert set(PUBLIC) <= set(webhook.__all__) and set(PUBLIC) <= set(dir(webhook))
    with pytest.raises(AttributeError):
        webhook.no_such_name  # noqa: B018


def test_importing_the_package_or_its_engine_does_not_import_flask():
    probe = (
        "import sys, webhook; webhook.evaluate, webhook.Config, webhook.load_snapshot; "
        "print('flask' in sys.modules, 'gunicorn' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.stdout == "False False\n", result.stderr


def _keys(typed) -> set[str]:
    return set(typed.__required_keys__ | typed.__optional_keys__)


@pytest.mark.parametrize(
    ("config", "name", "endpoint"),
    [
        ({}, "incident-1-pinned-deployment", "validate"),  # denied
        ({"policies": {"pinnedNodeName": {"mode": "fix"}}}, "incident-1-pinned-deployment", "mutate"),
        ({"policies": {"deviceScheduler": {"mode": "warn"}}}, "incident-2-mixed-scheduler-job", "validate"),
        ({}, "good-deployment", "validate"),
    ],
)
def test_every_field_of_a_reply_is_in_the_typed_contract(config, name, endpoint):
    reply = make_client(config).post(f"/{endpoint}", json=example(name)).get_json()
    assert set(reply) <= _keys(ReviewBody)
    assert Response.__required_keys__ <= set(reply["response"]) <= _keys(Response)
    assert set(reply["response"].get("status", Status(code=0, reason="", message=""))) == _keys(Status)
