"""``admit-guard explain``: the scheduler's and the kubelet's verdicts on every node, per pod or template."""

from __future__ import annotations

import sys

import click

from .options import (
    EXIT_DENIED,
    EXIT_INPUT_ERROR,
    InputError,
    cluster_option,
    config_option,
    dry_run_state,
    live_cluster_options,
    load_config,
    manifest_options,
    output_option,
)


@click.command()
@manifest_options("Manifest file or directory.")
@cluster_option("Cluster snapshot file or directory (repeatable).")
@config_option
@output_option("json", "yaml")
@click.option("--summary", "summary_only", is_flag=True, help="One line per pod: the counts, not every node.")
@live_cluster_options
def explain(manifests, cluster, config_path, output, summary_only, kubeconfig, context) -> None:
    """Where could each pod go? Every node with the scheduler's filters and the kubelet's verdict.

    Exit status: 0 every pod fits somewhere, 1 some pod fits on no node, 2 input error.
    """
    from ..explain import explain_documents
    from . import render

    if not cluster and not (kubeconfig or context):
        raise InputError("explain needs cluster state: --cluster SNAPSHOT or --kubeconfig/--context")
    config = load_config(config_path)
    view = dry_run_state(cluster, kubeconfig, context)
    for warning in view.warnings:
        click.echo(f"WARNING {warning}", err=True)
    explained, errors = explain_documents(manifests, view.state, config)
    render.explanations(explained, errors, output, summary_only)
    if errors:
        sys.exit(EXIT_INPUT_ERROR)
    if any(e.fitting == 0 for e in explained):
        sys.exit(EXIT_DENIED)
