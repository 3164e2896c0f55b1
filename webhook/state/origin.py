"""Where the cluster is read from: snapshot files, or a live API server.

What a user names (snapshot files, a kubeconfig and context, or nothing at all inside a pod)
becomes a ``StateOrigin``. The origin answers the one question every face asks ("is this a
live cluster?") the same way, connects, lists once for a dry run or an audit, and turns every
failure into a ``StateError`` that says what could not be read. The running server makes its
``source.StateSource`` from an origin's connection.

The API client is imported only when a live cluster is used: the kubernetes package costs a
snapshot check more start-up time than the check itself takes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .snapshot import Snapshot, SnapshotError, load_snapshot, read_cluster_snapshot

if TYPE_CHECKING:
    from ..config import StormBreakerConfig
    from ..kube.workloads import WorkloadTable
    from .apiserver import ApiServer
    from .inventory import Inventory, Progress
    from .model import ClusterState


class StateError(Exception):
    """The cluster could not be read; the message says what, and why."""


@dataclass(frozen=True, slots=True)
class StateOrigin:
    snapshots: tuple[str, ...] = ()
    kubeconfig: str | None = None
    context: str | None = None

    @property
    def named_live(self) -> bool:
        """A kubeconfig or a context was named: that cluster, never a snapshot."""
        return bool(self.kubeconfig or self.context)

    @property
    def live(self) -> bool:
        """Named live, or in a pod with no snapshot: the server and the audit then read the
        API server with the pod's service account. A dry run does not (``dry_run_state``)."""
        return self.named_live or (not self.snapshots and "KUBERNETES_SERVICE_HOST" in os.environ)

    def connect(self) -> ApiServer:
        from kubernetes.config.config_exception import ConfigException

        from .apiserver import ApiServer

        if self.kubeconfig and not os.path.isfile(self.kubeconfig):
            raise StateError(f"--kubeconfig {self.kubeconfig}: no such file")
        try:
            return ApiServer.connect(self.kubeconfig, self.context)
        except (ConfigException, OSError, ValueError) as err:
            raise StateError(f"cannot use the cluster credentials of {self.credentials}: {err}") from None

    @property
    def credentials(self) -> str:
        """Where the credentials come from, as an error should name it."""
        if self.kubeconfig:
            where = self.kubeconfig
        elif not self.named_live and "KUBERNETES_SERVICE_HOST" in os.environ:
            where = "the pod's service account"
        else:
            where = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        return f"{where} (context {self.context})" if self.context else where

    def snapshot(self, storm: StormBreakerConfig | None = None) -> ClusterState | None:
        """The snapshot files' nodes and pods; None when none were named. With ``storm``,
        Failed pods feed breakers with those settings."""
        if not self.snapshots:
            return None
        try:
            return load_snapshot(self.snapshots, storm)
        except SnapshotError as err:
            raise StateError("cluster snapshot:\n  " + "\n  ".join(err.problems)) from None

    def read_snapshot(
        self,
        storm: StormBreakerConfig | None = None,
        on_object: Callable[[int], None] | None = None,
        as_of: float | None = None,
    ) -> Snapshot:
        """The snapshot files' state and what they held (``on_object``: objects read so far;
        ``as_of``: the storm breakers as they stood at that time)."""
        try:
            return read_cluster_snapshot(self.snapshots, storm, on_object, as_of)
        except SnapshotError as err:
            raise StateError("cluster snapshot:\n  " + "\n  ".join(err.problems)) from None

    def dry_run_state(self, storm: StormBreakerConfig | None = None) -> ClusterState | None:
        """The snapshot, or one list of the named live cluster; None when neither was named."""
        if not self.named_live:
            return self.snapshot(storm)
        from .apiserver import ApiError
        from .informer import live_snapshot
        from .storm import StormBreakers

        breakers = StormBreakers.from_config(storm) if storm is not None else None
        try:
            return live_snapshot(self.connect(), storm=breakers)
        except ApiError as err:
            raise StateError(f"cannot list nodes and pods: {err}") from None

    def inventory(
        self, progress: Progress | None = None, workloads: WorkloadTable | None = None
    ) -> Inventory:
        """Nodes, pods and every workload kind, for the audit: listed live (``progress`` on the
        way; custom resources of ``workloads`` that the cluster serves), else read from the
        snapshot files."""
        from ..kube.workloads import BUILT_IN
        from .apiserver import ApiError
        from .inventory import live_inventory, read_inventory

        table = workloads if workloads is not None else BUILT_IN
        try:
            if self.live:
                return live_inventory(self.connect(), progress=progress, workloads=table)
            return read_inventory(self.snapshots, table, progress)
        except SnapshotError as err:
            raise StateError("cluster objects:\n  " + "\n  ".join(err.problems)) from None
        except ApiError as err:
            raise StateError(f"cannot list the cluster's objects: {err}") from None
