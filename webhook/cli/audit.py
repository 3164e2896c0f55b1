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
    live_cluster_options,
    load_config,
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
@live_cluster_options
def audit(cluster, config_path, output, kubeconfig, context) -> None:
    """Report what in the cluster already breaks the guard's rules, worst first.

    Pinned workloads (with the kubelet's verdict on their node), admission storms and their
    Failed pods, nodes where schedulers share a device, overcommitted nodes.
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
    now = time.time()
    report = run_audit(inventory, config, now)
    render.audit_report(report, output, now)
    sys.exit(EXIT_DENIED if report.findings else 0)
