"""The webhook app in-process over the example cluster, and its reviews."""

from __future__ import annotations

import json

from tests.helpers.paths import EXAMPLES
from webhook.config import config_from_dict
from webhook.serve.app import create_app
from webhook.state.snapshot import load_snapshot
from webhook.state.source import FixedState

CLUSTER = load_snapshot([str(EXAMPLES / "cluster")])


def example(name: str) -> dict:
    return json.loads((EXAMPLES / "admission" / f"{name}.json").read_text())


def make_client(config: dict | None = None, *, max_body_bytes: int = 3 * 1024 * 1024):
    app = create_app(config_from_dict(config or {}), FixedState(CLUSTER), max_body_bytes=max_body_bytes)
    return app.test_client()


def post(client, endpoint: str, review: dict):
    reply = client.post(f"/{endpoint}", json=review)
    assert reply.status_code == 200, reply.get_data(as_text=True)
    body = reply.get_json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    assert body["response"]["uid"] == review["request"]["uid"]
    return body["response"]


def answer(client, review: dict) -> dict:
    """The response a /validate of ``review`` gets (the binds' and claims' tests share it)."""
    reply = client.post("/validate", json=review)
    assert reply.status_code == 200, reply.get_data(as_text=True)
    return reply.get_json()["response"]
