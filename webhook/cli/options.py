"""What the commands share: their common options, what those options name (a config, the
cluster), and the exit statuses.

Every input the user named and the guard cannot use becomes an ``InputError``: one line (or
one list) that names the file or the flag, exit 2, never a traceback. What an option names is
read by the face it belongs to, imported when a command runs (see the package docstring).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from ..config import Config
    from ..state import ClusterState
    from ..state.origin import StateOrigin

EXIT_DENIED = 1
EXIT_INPUT_ERROR = 2


class InputError(click.ClickException):
    """Unusable config or cluster snapshot: exit 2, like every other input error."""

    exit_code = EXIT_INPUT_ERROR


def manifest_options(help: str):
    """``-f/--filename``, repeatable: the manifests a command judges. An option about which
    manifests are read belongs here, so that every command reading them takes it."""
    return click.option("-f", "--filename", "files", multiple=True, required=True, help=help)


def cluster_option(help: str):
    """``--cluster``, repeatable: snapshot files (``--kubeconfig`` is the live alternative)."""
    return click.option("--cluster", "cluster", multiple=True, help=help)


def config_option(command):
    """``--config FILE``: the policy config; the defaults without it."""
    return click.option(
        "--config", "config_path", type=click.Path(dir_okay=False), help="Policy config file."
    )(command)


def output_option(*formats: str, help: str | None = None):
    """``-o/--output``: ``text`` by default, else one of ``formats``."""
    return click.option(
        "-o",
        "--output",
        type=click.Choice(["text", *formats]),
        default="text",
        show_default=True,
        help=help,
    )


def live_cluster_options(command):
    """``--kubeconfig`` / ``--context``: read state from a live API server."""
    command = click.option("--context", help="kubeconfig context for live cluster state.")(command)
    return click.option(
        "--kubeconfig",
        type=click.Path(dir_okay=False),
        help="Read nodes and pods live from this cluster (in a pod: the service account).",
    )(command)


def load_config(path: str | None) -> Config:
    from .. import config

    if path is None:
        return config.Config()
    try:
        return config.load_config(path)
    except config.ConfigError as err:
        raise InputError(str(err)) from None


def state_origin(cluster: tuple[str, ...], kubeconfig: str | None, context: str | None) -> StateOrigin:
    """Where ``--cluster`` or ``--kubeconfig``/``--context`` say the cluster is: one of them."""
    from ..state.origin import StateOrigin

    if cluster and (kubeconfig or context):
        raise InputError("--cluster and --kubeconfig/--context are exclusive: one source of state")
    return StateOrigin(tuple(cluster), kubeconfig, context)


def dry_run_state(
    cluster: tuple[str, ...], kubeconfig: str | None, context: str | None, config: Config | None = None
) -> ClusterState | None:
    """The snapshot files, or one list of the named live cluster; None when neither is given.
    With a config, Failed pods feed its storm breakers."""
    with reading_cluster():
        origin = state_origin(cluster, kubeconfig, context)
        return origin.dry_run_state(config.storm_breaker if config is not None else None)


@contextmanager
def reading_cluster() -> Iterator[None]:
    """A read of the cluster whose failure, a ``StateError``, is an input error."""
    from ..state.origin import StateError

    try:
        yield
    except StateError as err:
        raise InputError(str(err)) from None
