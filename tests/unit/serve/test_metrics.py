"""The request path updates the state gauges at most once a second; a scrape always does."""

from webhook.serve import metrics as metrics_module
from webhook.serve.metrics import Metrics
from webhook.state.source import Readiness


def test_state_gauges_are_set_from_the_request_path_at_most_once_a_second(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(metrics_module.time, "monotonic", lambda: clock[0])
    metrics = Metrics()
    asked: list[int] = []

    def readiness() -> Readiness:
        asked.append(1)
        return Readiness(ready=True, reason="", nodes=len(asked), pods=0)

    for _ in range(100):
        metrics.observe_state_now_and_then(readiness, "snapshot")
    clock[0] += metrics_module.STATE_OBSERVE_INTERVAL
    metrics.observe_state_now_and_then(readiness, "snapshot")
    assert len(asked) == 2
    assert b'admit_guard_state_objects{kind="node"} 2.0' in metrics.scrape()


def test_label_values_from_requests_come_from_a_closed_set():
    from tests.helpers.app import example, make_client

    client = make_client()
    before = len(client.get("/metrics").get_data())
    for n in range(2000):
        review = example("good-deployment")
        review["request"]["kind"]["kind"] = f"Kind{n}" + "x" * 100
        review["request"]["operation"] = f"OP{n}"
        client.post("/validate", json=review)
    text = client.get("/metrics").get_data(as_text=True)
    kinds = {
        line.split('kind="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("admit_guard_requests_total{")
    }
    assert kinds <= metrics_module.KINDS | {"other"}
    assert "OP1" not in text
    assert len(text) < before + 5000


def test_only_the_first_distinct_reasons_keep_their_name():
    metrics = Metrics()
    for n in range(metrics_module.MAX_REASONS + 100):
        metrics.count_finding("nodeAdmission", f"OutOfexample.com/r{n}", "denied")
    text = metrics.scrape().decode()
    reasons = {line.split('reason="')[1].split('"')[0] for line in text.splitlines() if 'reason="' in line}
    assert len(reasons) == metrics_module.MAX_REASONS + 1 and "other" in reasons


def test_a_storm_breaker_that_closed_reads_0_after_the_next_publish_not_its_last_value():
    from types import SimpleNamespace

    from webhook.kube.rejection import Owner

    metrics = Metrics()
    trainer = SimpleNamespace(owner=Owner(uid="rs-uid", kind="ReplicaSet", name="trainer", namespace="ml"))
    storm = SimpleNamespace(breakers=[trainer], trips=1, probes=0, prune=lambda now: None)
    storm.open_breakers = lambda: storm.breakers
    sample = b'admit_guard_storm_breakers_open{namespace="ml",owner="ReplicaSet/trainer"}'
    metrics.storm.publish(storm)
    assert sample + b" 1.0" in metrics.scrape()
    storm.breakers = []
    metrics.storm.publish(storm)
    assert sample + b" 0.0" in metrics.scrape()
