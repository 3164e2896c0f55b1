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


def test_each_answered_review_counts_once_and_observes_its_latency_once():
    metrics = Metrics()
    for _ in range(3):
        metrics.count_request("validate", "Pod", "CREATE", "allow", 0.0003)
    metrics.count_request("validate", "Pod", "CREATE", "deny", 0.002)
    text = metrics.scrape().decode()
    labels = 'endpoint="validate",kind="Pod",operation="CREATE"'
    assert f'admit_guard_requests_total{{{labels},verdict="allow"}} 3.0' in text
    assert f'admit_guard_requests_total{{{labels},verdict="deny"}} 1.0' in text
    assert 'admit_guard_decision_seconds_count{endpoint="validate"} 4.0' in text
    assert 'admit_guard_decision_seconds_bucket{endpoint="validate",le="0.0005"} 3.0' in text


def test_labels_a_client_made_up_are_counted_as_other_and_never_remembered():
    metrics = Metrics()
    for n in range(500):
        metrics.count_request("validate", f"Kind{n}", f"OP{n}", "allow", 0.001)
    metrics.count_request("validate", "Pod", "CREATE", "allow", 0.001)
    assert 'kind="other",operation="other",verdict="allow"} 500.0' in metrics.scrape().decode()
    # The per-review lookup holds the closed sets' labels only: a client cannot grow it.
    assert list(metrics._request_children) == [("validate", "Pod", "CREATE", "allow")]


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
