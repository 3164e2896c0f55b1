"""``admit-guard audit``: what in a cluster already breaks the guard's rules, worst first."""

from __future__ import annotations

import sys
import time

import click

from .options import (
    EXIT_DENIED,
    InputError,
    cluster_option,
    config_option,
    junit_option,
    live_cluster_options,
    load_config,
    now_option,
    output_option,
    reading_cluster,
    state_origin,
)


@click.command()
@cluster_option(
    "Cluster snapshot: 'kubectl get nodes,pods,deployments,replicasets,statefulsets,daemonsets,"
    "jobs,cronjobs,replicationcontrollers -A -o yaml' output (repeatable)."
)
@config_option
@output_option(
    "json",
    "yaml",
    "policyreport",
    help="policyreport: wgpolicyk8s.io/v1alpha2 PolicyReports per namespace and a ClusterPolicyReport.",
)
@now_option
@junit_option("finding (and one per finding type found clean)")
@live_cluster_options
def audit(cluster, config_path, output, now, junit, kubeconfig, context) -> None:
    """Report what in the cluster already breaks the guard's rules, worst first.

    Pinned workloads (with the kubelet's verdict on their node), admission storms and their
    Failed pods, nodes where schedulers share a device, overcommitted nodes. It says what it
    read, and which finding types the input could not show.
    Exit status: 0 clean, 1 findings, 2 usage or input error.
    """
    from ..audit import run_audit
    from ..state.inventory import Progress
    from . import render

    config = load_config(config_path)
    origin = state_origin(cluster, kubeconfig, context)
    if not origin.live and not cluster:
        raise InputError("no cluster to audit: give --cluster SNAPSHOT... or --kubeconfig/--context")
    with reading_cluster():
        inventory = origin.inventory(progress=Progress(), workloads=config.workloads)
    facts = inventory.facts
    if not origin.live and facts.missing():
        raise InputError(f"cluster snapshot {', '.join(cluster)} {facts.missing()}")
    moment = now if now is not None else (facts.newest if not origin.live and facts.newest else time.time())
    report = run_audit(inventory, config, moment)
    warnings = [] if origin.live else facts.warnings()
    render.audit_report(report, output, moment, warnings=warnings)
    if junit:
        render.audit_junit(report, junit)
    sys.exit(EXIT_DENIED if report.findings else 0)
