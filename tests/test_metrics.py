"""The request path updates the state gauges at most once a second; a scrape always does."""

from webhook import metrics as metrics_module
from webhook.metrics import Metrics
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
