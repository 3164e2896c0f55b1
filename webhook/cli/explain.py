"""``admit-guard explain``: the kubelet's verdict on every node, for each pod or template."""

from __future__ import annotations

import sys

import click

from .options import (
    EXIT_DENIED,
    EXIT_INPUT_ERROR,
    InputError,
    cluster_option,
    dry_run_state,
    live_cluster_options,
    manifest_options,
    output_option,
)


@click.command()
@manifest_options("Manifest file or directory.")
@cluster_option("Cluster snapshot file or directory (repeatable).")
@output_option("json", "yaml")
@live_cluster_options
def explain(manifests, cluster, output, kubeconfig, context) -> None:
    """Where could each pod go? The kubelet's verdict on every node, as if it were bound there.

    Exit status: 0 every object fits somewhere, 1 some object fits on no node, 2 input error.
    """
    from ..explain import explain_documents
    from . import render

    if not cluster and not (kubeconfig or context):
        raise InputError("explain needs cluster state: --cluster SNAPSHOT or --kubeconfig/--context")
    view = dry_run_state(cluster, kubeconfig, context)
    for warning in view.warnings:
        click.echo(f"WARNING {warning}", err=True)
    explained, errors = explain_documents(manifests, view.state)
    render.explanations(explained, errors, output)
    if errors:
        sys.exit(EXIT_INPUT_ERROR)
    if any(e.admitting == 0 for e in explained):
        sys.exit(EXIT_DENIED)
