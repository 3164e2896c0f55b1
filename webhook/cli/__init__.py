"""The ``admit-guard`` command line: the engine's dry-run face for CI and for people.

One module per command. A command parses its options and delegates: the logic lives in the
face it calls (``dryrun``, ``explain``, ``audit``, ``policytest``, ``certs``, ``vap``, the
server), everything printed in ``render``, the options several commands share in ``options``.

Commands import what they delegate to when they run: ``admit-guard --help`` then costs no
more than click, and ``check`` never loads Flask, gunicorn or the kubernetes client.
"""

from __future__ import annotations

import click

from .. import KUBERNETES_VERSION
from . import audit, certs, check, explain, serve, test, vap

# click fills in the version only when it is asked for: reading package metadata costs
# every other command start-up time.
_VERSION = f"admit-guard %(version)s (kubelet admission rules of Kubernetes {KUBERNETES_VERSION})"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="admit-guard", message=_VERSION)
def main() -> None:
    """Stop pinned-nodeName pod storms and mixed-scheduler device conflicts before they start."""


@main.command()
def version() -> None:
    """The package version and the Kubernetes version whose kubelet rules it follows."""
    from importlib.metadata import version

    click.echo(_VERSION % {"version": version("admit-guard")})


main.add_command(check.check)
main.add_command(explain.explain)
main.add_command(audit.audit)
main.add_command(test.test)
main.add_command(vap.vap)
main.add_command(certs.certs)
main.add_command(serve.serve)
