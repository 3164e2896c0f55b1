"""``admit-guard check``: manifests judged as the admission webhook would judge them."""

from __future__ import annotations

import sys

import click

from .options import (
    EXIT_DENIED,
    EXIT_INPUT_ERROR,
    cluster_option,
    config_option,
    dry_run_state,
    junit_option,
    live_cluster_options,
    load_config,
    manifest_options,
    now_option,
    output_option,
)


@click.command()
@manifest_options("Manifest file or directory (repeatable); '-' reads stdin.")
@cluster_option("Cluster snapshot: 'kubectl get nodes,pods -A -o yaml' output (repeatable).")
@config_option
@output_option("json", "yaml")
@click.option(
    "--operation", type=click.Choice(["CREATE", "UPDATE"]), default="CREATE", show_default=True, hidden=True
)
@click.option("--as", "user", default="", help="Evaluate as this user (for exemptions), like kubectl.")
@click.option("--as-group", "groups", multiple=True, help="Evaluate as a member of this group (repeatable).")
@click.option("--warnings-as-errors", is_flag=True, help="Exit 1 when any warning was given.")
@click.option("-q", "--fail-only", is_flag=True, help="Print only denials, warnings and input errors.")
@click.option("-v", "--verbose", is_flag=True, help="List skipped objects too (else counted in the summary).")
@now_option
@junit_option("object (and input error)")
@live_cluster_options
def check(
    manifests,
    cluster,
    config_path,
    output,
    operation,
    user,
    groups,
    warnings_as_errors,
    fail_only,
    verbose,
    now,
    junit,
    kubeconfig,
    context,
) -> None:
    """Check manifests as the admission webhook would.

    Objects that create no pods are skipped (counted in the summary; -v lists them). Exit
    status: 0 all allowed (or skipped, or exempt), 1 any denied (or warned, with
    --warnings-as-errors), 2 usage or input error.
    """
    from ..dryrun import Summary, check_documents
    from ..state.gc_pause import collector_paused
    from . import render

    config = load_config(config_path)
    reading = render.Progress(sys.stderr, line="read {:,} snapshot objects...")
    view = dry_run_state(cluster, kubeconfig, context, config, on_object=reading.tick, as_of=now)
    reading.done()
    moment = view.judged_at(now)
    progress = render.Progress(sys.stderr)
    # Tens of thousands of objects stay alive until the report is printed: the collector's
    # full passes over them would cost as much as the parse, and they hold no cycles.
    with collector_paused():
        results, errors = check_documents(
            manifests,
            view.state,
            config,
            operation=operation,
            user=user,
            groups=tuple(groups),
            on_document=progress.tick,
            now=moment,
        )
        progress.done()
        summary = Summary.of(results, errors)
        if output == "text":
            render.cluster_text(view, moment, told=now is not None)
        render.check_report(
            results,
            errors,
            summary,
            output,
            fail_only,
            verbose=verbose,
            cluster=render.cluster_json(view, moment),
        )
        if junit:
            render.check_junit(results, errors, junit, warnings_as_errors)
    if errors:
        sys.exit(EXIT_INPUT_ERROR)
    warned = summary.warned or (view.warnings and view.state is not None)
    if summary.denied or (warnings_as_errors and warned):
        sys.exit(EXIT_DENIED)
