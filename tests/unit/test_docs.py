"""docs/reference/ is generated from the registries (``make docs``, ``webhook/docs.py``): the
committed pages must be what the code generates now, and must say what the registries hold."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.helpers.paths import ROOT
from webhook import docs
from webhook.checks import KUBELET_CHECKS
from webhook.config import TOP_LEVEL_KEYS
from webhook.kube.workloads import WORKLOADS
from webhook.policies.registry import POLICIES


def test_the_committed_reference_pages_are_the_generated_ones():
    stale = [str(path) for path in docs.stale(ROOT)]
    assert stale == [], f"stale generated docs: {', '.join(stale)}: run `make docs` and commit them"


def test_every_generated_page_is_in_the_mkdocs_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    for path in docs.pages():
        assert str(path.relative_to("docs")) in nav, path


def test_the_reference_names_every_policy_reason_check_kind_and_key():
    pages = {path.name: text for path, text in docs.pages().items()}
    for policy in POLICIES:
        assert f"| `{policy.NAME}` |" in pages["policies.md"]
        assert f"`policies.{policy.NAME}.mode`" in pages["config.md"]
        for reason in policy.REASONS:
            assert f"| `{reason}` | policy `{policy.NAME}` |" in pages["reasons.md"]
    for i, check in enumerate(KUBELET_CHECKS, 1):
        assert f"| {i} | {check.name} |" in pages["kubelet-checks.md"]
        assert all(f"`{reason}`" in pages["reasons.md"] for reason in check.reasons)
    for workload in WORKLOADS:
        assert f"| `{workload.group}` | {workload.kind} |" in pages["workloads.md"]
    for key in TOP_LEVEL_KEYS:
        assert f"| `{key}` |" in pages["config.md"]
    for metric in (
        "admit_guard_requests_total",
        "admit_guard_decision_seconds",
        "admit_guard_state_age_seconds",
    ):
        assert f"| `{metric}` |" in pages["metrics.md"]


def test_the_metrics_page_names_every_metric_the_monitoring_rules_may_use():
    """Every metric name the alert rules and the dashboard query is one the page lists."""
    page = docs.metrics_page()
    monitoring = "".join(p.read_text() for p in (ROOT / "deploy" / "monitoring").rglob("*.yaml"))
    used = set(re.findall(r"\badmit_guard_[a-z_]+", monitoring))
    listed = set(re.findall(r"`(admit_guard_[a-z_]+)`", page))
    # A histogram is queried by its series (_bucket, _sum, _count).
    unlisted = {name for name in used if name not in listed and name.rsplit("_", 1)[0] not in listed}
    assert unlisted == set()


def test_check_says_which_pages_are_stale(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "webhook.docs", "--check"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert "docs/reference/policies.md is stale: run `make docs`" in result.stderr


def test_every_kubelet_check_cites_a_section_of_a_spec_page_that_exists():
    """The spec column links the spec each check follows (the topology manager's has its own)."""
    rows = [line for line in docs.checks_page().splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) == len(KUBELET_CHECKS)
    for row in rows:
        cited = re.search(r"\[§[\d.\-]+\]\(\.\./([\w-]+\.md)\) \|$", row)
        assert cited is not None, row
        assert (ROOT / "docs" / cited.group(1)).is_file()
    assert "[§7](../topology-admission-spec.md)" in docs.checks_page()


def test_a_citation_inside_a_sentence_stays_in_the_checks_text():
    assert docs.SPEC.sub("", "refuses (topology-admission-spec §9; where declared).") == (
        "refuses (topology-admission-spec §9; where declared)."
    )
    assert (
        docs.SPEC.sub("", "host ports must be free. kubelet-admission-spec §7.") == "host ports must be free."
    )
