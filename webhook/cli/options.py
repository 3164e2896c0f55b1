"""What the commands share: their common options, what those options name (a config, the
cluster), and the exit statuses.

Every input the user named and the guard cannot use becomes an ``InputError``: one line (or
one list) that names the file or the flag, exit 2, never a traceback. What an option names is
read by the face it belongs to, imported when a command runs (see the package docstring).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from ..config import Config
    from ..state import ClusterState
    from ..state.origin import StateOrigin
    from ..state.snapshot import SnapshotFacts

EXIT_DENIED = 1
EXIT_INPUT_ERROR = 2


class InputError(click.ClickException):
    """Unusable config or cluster snapshot: exit 2, like every other input error."""

    exit_code = EXIT_INPUT_ERROR


def manifest_options(help: str):
    """The manifests a command judges, passed to it as ``manifests`` (a ``Manifests``):
    ``-f/--filename`` and ``-k/--kustomize`` (repeatable, at least one), ``--exclude GLOB``
    for files under ``-f`` directories, ``-n/--namespace`` for objects that name none. An
    option about which manifests are read belongs here, so that every command reading them
    takes it."""
    options = (
        click.option("-f", "--filename", "files", multiple=True, help=help),
        click.option(
            "-k",
            "--kustomize",
            "kustomizations",
            multiple=True,
            metavar="DIR",
            help="Kustomization directory, rendered with 'kubectl kustomize' (repeatable).",
        ),
        click.option(
            "--exclude",
            multiple=True,
            metavar="GLOB",
            help="Leave out files under -f directories whose path, name or a directory name matches "
            "(repeatable), e.g. --exclude 'charts' --exclude '*.test.yaml'.",
        ),
        click.option(
            "-n",
            "--namespace",
            metavar="NAMESPACE",
            help="Namespace of objects that name none, as kubectl's (default: default).",
        ),
    )

    def decorate(command):
        @functools.wraps(command)
        def with_manifests(*args, files, kustomizations, exclude, namespace, **kwargs):
            from ..formats.manifests import Manifests

            if not files and not kustomizations:
                raise click.UsageError("give the manifests: -f FILE|DIR|- or -k DIR (repeatable)")
            manifests = Manifests(
                tuple(files), tuple(exclude), tuple(kustomizations), namespace or "default", bool(namespace)
            )
            return command(*args, manifests=manifests, **kwargs)

        for option in reversed(options):
            with_manifests = option(with_manifests)
        return with_manifests

    return decorate


def now_option(command):
    """``--now TIME`` (RFC 3339): when the cluster is judged (storm breakers compare times)."""
    return click.option(
        "--now",
        callback=_rfc3339,
        metavar="TIME",
        help="Judge at this time (RFC 3339, e.g. 2026-01-01T12:00:00Z); default: the newest "
        "timestamp in the snapshot (the time it was taken), or now for a live cluster.",
    )(command)


def _rfc3339(_context, _param, value: str | None) -> float | None:
    from ..kube.timestamps import rfc3339_seconds

    if value is None:
        return None
    try:
        return rfc3339_seconds(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def junit_option(what: str):
    """``--junit FILE``: the results as JUnit XML too, for CI systems that show them."""
    return click.option(
        "--junit",
        "junit",
        type=click.Path(dir_okay=False),
        help=f"Also write JUnit XML: one test case per {what}.",
    )


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


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The state a dry run judges against, and what is known of it."""

    state: ClusterState | None  # None: no cluster state was given
    facts: SnapshotFacts | None = None  # what snapshot files held (None for a live list)
    live: bool = False

    @property
    def warnings(self) -> list[str]:
        return self.facts.warnings() if self.facts is not None else []

    def judged_at(self, now: float | None) -> float:
        """``--now``, else when the snapshot was taken, else the wall clock."""
        if now is not None:
            return now
        if self.facts is not None and self.facts.newest is not None:
            return self.facts.newest
        return time.time()


def dry_run_state(
    cluster: tuple[str, ...],
    kubeconfig: str | None,
    context: str | None,
    config: Config | None = None,
    on_object=None,
    as_of: float | None = None,
) -> ClusterView:
    """The snapshot files, or one list of the named live cluster; no state when neither is
    given. With a config, Failed pods feed its storm breakers, as they stood at ``as_of``
    (``--now``) when given. Files that hold no cluster (no Node: a manifest, a table) are an
    input error."""
    storm = config.storm_breaker if config is not None else None
    with reading_cluster():
        origin = state_origin(cluster, kubeconfig, context)
        if origin.named_live:
            return ClusterView(origin.dry_run_state(storm), live=True)
        if not cluster:
            return ClusterView(None)
        snapshot = origin.read_snapshot(storm, on_object, as_of)
    missing = snapshot.facts.missing()
    if missing:
        raise InputError(f"cluster snapshot {', '.join(cluster)} {missing}")
    return ClusterView(snapshot.state, snapshot.facts)


@contextmanager
def reading_cluster() -> Iterator[None]:
    """A read of the cluster whose failure, a ``StateError``, is an input error."""
    from ..state.origin import StateError

    try:
        yield
    except StateError as err:
        raise InputError(str(err)) from None
