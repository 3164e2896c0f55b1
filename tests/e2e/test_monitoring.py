"""deploy/monitoring: the alerts pass their promtool unit tests, and every alert and dashboard
query names a metric the guard exports."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.audit_gauges import ScrapedGauges
from tests.helpers.paths import ROOT
from webhook.serve.metrics import Metrics
from webhook.serve.tls import EXPIRY_METRIC
from webhook.state.source import Readiness

MONITORING = ROOT / "deploy" / "monitoring"
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
}
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "by", "without", "rate", "increase", "irate", "time",
    "histogram_quantile", "vector", "or", "and", "unless", "topk", "bottomk", "max_over_time",
    "min_over_time", "absent", "clamp_min", "on", "ignoring", "bool", "offset",
}  # fmt: skip


def exported_metrics() -> set[str]:
    """Every sample name a scrape of the guard can carry, read from a real scrape."""
    metrics = Metrics()
    metrics.observe_state(Readiness(True, "synced", 1, 1, updated_at=1.0), "informer")
    names = {EXPIRY_METRIC}
    audit = ScrapedGauges()  # the master's (``serve --audit-interval``)
    audit.publish({("MixedDeviceScheduler", ""): 1}, "informer", 1.0, 0.1)
    for text in (metrics.scrape().decode(), audit.scrape()):
        for family in text_string_to_metric_families(text):
            names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (labels, ranges, strings and functions removed)."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)
    words = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr))
    return {w for w in words if w not in PROMQL_WORDS and not re.fullmatch(r"\d+[smhdwy]?", w)}


def rule_groups() -> dict:
    return yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())["spec"]


def dashboard_queries() -> list[str]:
    def walk(panels):
        for panel in panels:
            yield from (t["expr"] for t in panel.get("targets", []))
            yield from walk(panel.get("panels", []))

    return list(walk(json.loads((MONITORING / "dashboard.json").read_text())["panels"]))


def test_metric_names_are_read_out_of_promql():
    expr = 'histogram_quantile(0.99, sum by (le) (rate(admit_guard_decision_seconds_bucket{x="a b"}[5m])))'
    assert metric_names(expr) == {"admit_guard_decision_seconds_bucket"}
    assert metric_names("min(a_metric) - time() < 30 * 86400") == {"a_metric"}


def test_every_dashboard_query_names_a_metric_the_guard_exports():
    exported = exported_metrics()
    queries = dashboard_queries()
    assert len(queries) >= 15
    for expr in queries:
        names = metric_names(expr)
        assert names, expr
        assert names <= exported, f"{expr}: {sorted(names - exported)} not exported"


def test_every_alert_names_a_metric_the_guard_exports():
    exported = exported_metrics()
    rules = [r for group in rule_groups()["groups"] for r in group["rules"]]
    assert {r["alert"] for r in rules} == {
        "AdmitGuardAdmissionStorm",
        "AdmitGuardStormBreakerTrips",
        "AdmitGuardMixedDeviceSchedulerNodes",
        "AdmitGuardDRADeviceHandedOutTwice",
        "AdmitGuardStateStale",
        "AdmitGuardNotReady",
        "AdmitGuardWebhookErrors",
        "AdmitGuardFailOpenDecisions",
        "AdmitGuardCertificateExpiring",
    }
    for rule in rules:
        names = metric_names(rule["expr"])
        assert names and names <= exported, f"{rule['alert']}: {sorted(names - exported)} not exported"


def test_a_name_the_guard_does_not_export_is_caught():
    assert "admit_guard_made_up_total" not in exported_metrics()
    assert "admit_guard_audit_findings" in exported_metrics()


def promtool() -> str:
    """promtool from PATH, else installed from Debian's prometheus package; never a silent skip."""
    found = shutil.which("promtool")
    if found:
        return found
    install = ["apt-get", "install", "-y", "--no-install-recommends", "prometheus"]
    if os.geteuid() != 0:
        install = ["sudo", "-n", *install]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    result = subprocess.run(install, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:  # a fresh machine has no package lists yet
        update = [*install[: install.index("install")], "update"]
        subprocess.run(update, capture_output=True, text=True, env=env, check=False)
        result = subprocess.run(install, capture_output=True, text=True, env=env, check=False)
    found = shutil.which("promtool")
    if not found:
        pytest.fail(
            "promtool is needed to test deploy/monitoring and could not be installed "
            f"({' '.join(install)} exited {result.returncode}: {result.stderr.strip()[-300:]}). "
            "Install Debian's 'prometheus' package (make promtool)."
        )
    return found


def test_the_alert_rules_pass_their_promtool_unit_tests(tmp_path):
    tool = promtool()
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups()))
    shutil.copy(MONITORING / "tests" / "alerts.test.yaml", tmp_path)
    check = subprocess.run(
        [tool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run(
        [tool, "test", "rules", "alerts.test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert test.returncode == 0, test.stdout + test.stderr


def test_the_kustomization_ships_the_rules_the_scrape_and_the_dashboard():
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    for name in (*kustomization["resources"], *kustomization["configMapGenerator"][0]["files"]):
        assert (MONITORING / name).is_file(), name


def test_the_certificate_expiry_is_exported_across_gunicorn_workers(tmp_path):
    """In the multi-process mode ``serve`` uses, the worker's recorded expiry reaches a scrape."""
    from webhook.certs import issue

    issue("admit-guard", "admit-guard", tmp_path / "certs")
    script = f"""
import os
os.environ["PROMETHEUS_MULTIPROC_DIR"] = {str(tmp_path)!r}
from pathlib import Path
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from webhook.serve.tls import certificate_expiry, record_certificate_expiry
cert = Path({str(tmp_path / "certs" / "tls.crt")!r})
record_certificate_expiry(cert)
registry = CollectorRegistry()
MultiProcessCollector(registry)
print(certificate_expiry(cert))
print(generate_latest(registry).decode())
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    expiry, scrape = result.stdout.split("\n", 1)
    [family] = [f for f in text_string_to_metric_families(scrape) if f.name == EXPIRY_METRIC]
    [sample] = family.samples
    assert sample.value == pytest.approx(float(expiry))
    assert sample.labels["certificate"].endswith("tls.crt")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl renders kustomize (as in test_deploy)")
def test_uninstall_and_monitoring_render_in_a_clone_without_certificates(tmp_path):
    """The uninstall steps (docs/deploy.md) delete ``-k deploy/base`` and ``-k deploy/monitoring``:
    both must build where no ``make deploy-certs`` ever ran."""
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy", ignore=shutil.ignore_patterns("certs"))
    kinds = {}
    for part in ("base", "monitoring"):
        text = subprocess.run(
            ["kubectl", "kustomize", str(tmp_path / "deploy" / part)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        kinds[part] = {doc["kind"] for doc in yaml.safe_load_all(text) if doc}
    assert {"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "Namespace"} <= kinds["base"]
    assert kinds["monitoring"] == {"PrometheusRule", "ServiceMonitor", "ConfigMap"}
