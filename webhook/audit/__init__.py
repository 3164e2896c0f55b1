"""The audit: what in a cluster already breaks the guard's rules, and where storms left damage.

Pure: an ``Inventory``, the config and the current time come in, findings come out. The audit
names no policy: it asks every policy of ``registry.AUDIT_POLICIES`` that is not off for its
findings (its ``audit`` hook, which uses the policy's own checks, so that an audit finding and
a denial say the same thing), and says which finding types the inventory could not show (a
policy's ``AUDIT_READS`` that was not read). ``report.py`` orders and renders them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..config import Config
from ..policies import AuditPass, AuditScope, Context, Finding, Mode, audit_reads
from ..policies.registry import AUDIT_POLICIES
from ..state.inventory import Inventory
from ..state.model import PODS, ClusterState
from .report import POLICY_OF, REPORT_NAME, TYPES, Report, policy_reports, worst_first

__all__ = [
    "REPORT_NAME",
    "TYPES",
    "Report",
    "audited",
    "node_findings",
    "periodic_passes",
    "policy_reports",
    "run_audit",
    "unjudged",
]

NODES_PER_CHUNK = 250  # nodes judged under one hold of the live state's lock
# What each finding type is judged from (``Inventory.missing`` names the inputs not read).
AUDIT_READS_OF = {found: read for policy in AUDIT_POLICIES for found, read in audit_reads(policy).items()}
# The policies with types judged per node: the server's periodic audit takes their nodes a chunk
# at a time, and publishes those types (a policy's other types need what the live state lacks).
NODE_POLICIES = tuple(policy for policy in AUDIT_POLICIES if PODS in audit_reads(policy).values())


def audited(config: Config, finding_type: str) -> bool:
    """Whether the policy of ``finding_type`` is on: a policy in mode ``off`` is not audited."""
    return config.mode(POLICY_OF[finding_type]) != Mode.OFF


def _on(config: Config, policies: Iterable[Any]) -> list[Any]:
    return [policy for policy in policies if config.mode(policy.NAME) != Mode.OFF]


def run_audit(inventory: Inventory, config: Config, now: float) -> Report:
    """Every finding in the inventory, worst first."""
    context = Context(inventory.state, config, now=now)
    scope = AuditScope(inventory)
    findings = [found for policy in _on(config, AUDIT_POLICIES) for found in policy.audit(scope, context)]
    scanned = {
        "nodes": len(inventory.state.nodes),
        "pods": inventory.pods_read,
        "workloads": len(inventory.workloads),
        "rejectedPods": len(inventory.rejected),
    }
    terms = {
        key: value
        for policy in AUDIT_POLICIES
        if hasattr(policy, "audit_terms")
        for key, value in policy.audit_terms(config).items()
    }
    report = Report(worst_first(findings), scanned, terms, judged_at=now)
    report.not_judged = {t: why for t, why in unjudged(inventory).items() if audited(config, t)}
    return report


def unjudged(inventory: Inventory) -> dict[str, str]:
    """The finding types whose input the inventory lacks, and what to add, in the order the
    inputs are read: "no findings" of a type the audit could not see is not a clean bill."""
    return {
        finding_type: why
        for read, why in inventory.missing().items()
        for finding_type in TYPES
        if AUDIT_READS_OF[finding_type] == read
    }


def periodic_passes(config: Config) -> list[tuple[tuple[str, ...], AuditPass]]:
    """The server's audit of its live state, as chunked passes with the finding types each
    publishes: one over the nodes for every policy audited per node, then each policy's own
    (``audit_pass``: claims, open breakers). Policies in mode ``off`` take no part."""
    found: list[Finding] = []
    nodes = AuditPass(
        keys=lambda state: list(state.nodes),
        step=lambda state, names: found.extend(node_findings(state, config, names)),
        findings=lambda state: found,
        chunk=NODES_PER_CHUNK,
        separable=True,
    )
    on = _on(config, NODE_POLICIES)
    per_node = tuple(t for policy in on for t in policy.AUDITS if AUDIT_READS_OF[t] == PODS)
    passes = [(per_node, nodes)] if on else []
    return passes + [
        (policy.AUDITS, policy.audit_pass(config))
        for policy in _on(config, AUDIT_POLICIES)
        if hasattr(policy, "audit_pass")
    ]


def node_findings(state: ClusterState, config: Config, names: Iterable[str]) -> list:
    """The per-node findings on the named nodes (a chunk, or all of them), from the state alone
    (no workloads: pods whose controller pinned nodeName count as their scheduler's)."""
    context = Context(state, config)
    scope = AuditScope(Inventory(state), tuple(names))
    return [found for policy in _on(config, NODE_POLICIES) for found in policy.audit(scope, context)]
