"""The audit's report: its findings worst first, what it scanned and could not judge, as JSON
and as PolicyReports. The one place a policy's ``Finding`` becomes an audit record."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..kube.timestamps import format_rfc3339
from ..policies import Finding
from ..policies.registry import AUDIT_POLICIES

# The finding types in report order (the summary's byType; among findings equally severe and
# many, the first type first), and the policy each belongs to.
TYPES = tuple(finding_type for policy in AUDIT_POLICIES for finding_type in policy.AUDITS)
POLICY_OF = {finding_type: policy.NAME for policy in AUDIT_POLICIES for finding_type in policy.AUDITS}
# The PolicyReport CRD's severities (wgpolicyk8s.io/v1alpha2 knows only these three).
SEVERITIES = ("high", "medium", "low")


def record(finding: Finding) -> dict[str, Any]:
    """A finding as the audit's JSON contract has it: these keys, exactly."""
    return {
        "type": finding.type,
        "severity": finding.severity,
        "namespace": finding.namespace,
        "kind": finding.kind,
        "name": finding.name,
        "node": finding.node or "",
        "resource": finding.resource,
        "count": finding.count,
        "message": finding.message,
    }


@dataclass(slots=True)
class Report:
    findings: list[Finding]
    scanned: dict[str, int] = field(default_factory=dict)
    # What the policies' settings made of the audit (``stormThreshold``), stated beside it.
    terms: dict[str, Any] = field(default_factory=dict)
    # Finding types the input could not show (no workloads, no Failed pods): type -> why.
    not_judged: dict[str, str] = field(default_factory=dict)
    judged_at: float | None = None

    @property
    def summary(self) -> dict[str, Any]:
        return {
            "findings": len(self.findings),
            "byType": {t: sum(f.type == t for f in self.findings) for t in TYPES},
            "bySeverity": {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES},
            "scanned": self.scanned,
            **self.terms,
            "notJudged": self.not_judged,
            "judgedAt": format_rfc3339(self.judged_at) if self.judged_at is not None else None,
        }

    def as_json(self) -> dict[str, Any]:
        return {"findings": [record(f) for f in self.findings], "summary": self.summary}


def worst_first(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(
        findings,
        key=lambda f: (
            SEVERITIES.index(f.severity),
            -f.count,
            TYPES.index(f.type),
            f.namespace,
            f.name,
            f.resource,
        ),
    )


REPORT_NAME = "admit-guard-audit"
SOURCE = "admit-guard"


def policy_reports(report: Report, now: float) -> list[dict[str, Any]]:
    """``wgpolicyk8s.io/v1alpha2``: a PolicyReport per namespace, a ClusterPolicyReport for nodes.

    The ClusterPolicyReport is always there, empty (summary all zero) on a clean cluster, so that
    applying the output replaces an earlier run's results. An empty PolicyReport cannot be given
    for every namespace that had findings before: the audit does not know them.
    """
    by_namespace: dict[str, list[Finding]] = {"": []}
    for finding in report.findings:
        by_namespace.setdefault(finding.namespace, []).append(finding)
    reports = []
    for namespace in sorted(by_namespace):
        results = [_result(f, now) for f in by_namespace[namespace]]
        metadata: dict[str, Any] = {
            "name": REPORT_NAME,
            "labels": {"app.kubernetes.io/managed-by": SOURCE},
        }
        kind = "ClusterPolicyReport"
        if namespace:
            metadata["namespace"] = namespace
            kind = "PolicyReport"
        reports.append(
            {
                "apiVersion": "wgpolicyk8s.io/v1alpha2",
                "kind": kind,
                "metadata": metadata,
                "summary": {
                    "pass": 0,
                    "fail": sum(r["result"] == "fail" for r in results),
                    "warn": sum(r["result"] == "warn" for r in results),
                    "error": 0,
                    "skip": 0,
                },
                "results": results,
            }
        )
    return reports


def _result(finding: Finding, now: float) -> dict[str, Any]:
    """A finding as a PolicyReport's result."""
    resource: dict[str, Any] = {"apiVersion": finding.api_version, "kind": finding.kind, "name": finding.name}
    if finding.namespace:
        resource["namespace"] = finding.namespace
    if finding.uid:
        resource["uid"] = finding.uid
    properties = {"node": finding.node or "", "resource": finding.resource, "count": str(finding.count)}
    return {
        "source": SOURCE,
        "policy": POLICY_OF[finding.type],
        "rule": finding.type,
        "category": "admit-guard audit",
        "result": "fail" if finding.severity == "high" else "warn",
        "severity": finding.severity,
        "scored": True,
        "message": finding.message,
        "resources": [resource] if finding.name else [],
        "properties": {k: v for k, v in properties.items() if v},
        "timestamp": {"seconds": int(now), "nanos": 0},
    }
