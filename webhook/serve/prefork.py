"""What ``serve`` prepares before gunicorn forks its workers, and what each worker builds after.

Before the fork, in the master: a fresh directory for the workers' metric files, a directory
the workers share for their reservation table, and the cluster state: a snapshot loaded once,
or the replica's informer (``replica``), so that every worker shares its pages; and the
replica's periodic audit of that state (``replica_audit``). After the fork, in each worker: its
own watches from where the master's state stands, its lease store (threads and connections do
not survive a fork), and the Flask app over them.

The metrics client picks its multi-process mode when it is first imported: ``worker_app`` and
``replica_audit`` import the metrics only when called, after ``metrics_directory``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import Config
    from ..state import ClusterState
    from ..state.origin import StateOrigin
    from .periodic_audit import PeriodicAudit
    from .replica import ReplicaState


def metrics_directory() -> None:
    """A fresh directory for the workers' metric files (stale files would skew counters)."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        for stale in Path(directory).glob("*.db"):
            stale.unlink()
    else:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(shared_directory("admit-guard-metrics-"))


def shared_directory(prefix: str) -> Path:
    """A fresh directory made before the fork, shared by the workers, removed at exit."""
    created, owner = tempfile.mkdtemp(prefix=prefix), os.getpid()
    # Workers inherit atexit hooks; only the process that made the directory removes it.
    atexit.register(lambda: os.getpid() == owner and shutil.rmtree(created, ignore_errors=True))
    return Path(created)


def guard_namespace(config: Config) -> str:
    """Where the coordination Leases live: the configured namespace, else the guard's own
    (``ADMIT_GUARD_NAMESPACE``, from the downward API in deploy/)."""
    return config.node_admission.reservations.namespace or os.environ.get(
        "ADMIT_GUARD_NAMESPACE", "admit-guard"
    )


def replica_state(config: Config, origin: StateOrigin, max_state_age: float) -> ReplicaState:
    """In the master, before gunicorn starts: the replica's informer, listing in the background
    (``serve.replica``)."""
    from ..state.informer import Informer, Timing
    from ..state.storm import StormBreakers
    from .replica import ReplicaState

    storm = StormBreakers.from_config(config.storm_breaker)
    leader = Informer(origin.connect(), Timing(max_age=max_state_age), storm, fork_first_list=True).start()
    return ReplicaState(leader).hold_across_forks()


def replica_audit(
    config: Config, replica: ReplicaState | None, state: ClusterState | None, interval: float
) -> PeriodicAudit:
    """In the master: the replica's one periodic audit (``serve --audit-interval``), of the state
    its workers are forked from (the leader's, or the snapshot); its gauges reach every worker's
    /metrics through the metric files. An audit in each worker read every record, and so copied
    the whole state into every worker: the replica held a copy of the cluster per worker again
    (issue 31). Each pass runs in a child forked for it, so that the master does not copy what
    the workers share."""
    from ..state.source import FixedState
    from .metrics import AuditGauges
    from .periodic_audit import PeriodicAudit

    source, name = (replica.leader, "informer") if replica is not None else (FixedState(state), "snapshot")
    return PeriodicAudit(source, config, AuditGauges(None), interval, name, in_child=True).start()


def worker_app(
    config: Config,
    origin: StateOrigin,
    state: ClusterState | None,
    *,
    reservations: Path,
    max_body_bytes: int,
    require_client_cert: bool = False,
    replica: ReplicaState | None = None,
) -> Callable[[], Any]:
    """The factory each worker calls after the fork. A live ``origin`` gives every worker its
    own Leases and an informer that follows ``replica``'s leader from the state the fork
    shared; else ``state``, the snapshot loaded before the fork, is shared."""
    from ..allocation import AllocationGuard
    from ..binding import BindGuard
    from ..coordination import allocations as in_flight
    from ..coordination import reservations as binds
    from ..coordination.probes import shared_probes
    from ..state.source import FixedState
    from .app import create_app
    from .lease_collector import COLLECT_SECONDS, LeaseCollector

    waits = config.node_admission.reservations

    def app():
        local = binds.node_table(reservations)
        api = origin.connect() if origin.live else None
        namespace = guard_namespace(config)
        probes = shared_probes(
            reservations / "storm", api, namespace, waits.wait_seconds, waits.deadline_seconds
        )
        pool_leases = in_flight.pool_leases(api, namespace) if api is not None else None
        allocations = AllocationGuard(config, in_flight.pool_table(reservations / "allocations"), pool_leases)
        if replica is not None:
            source = replica.follow(origin.connect())
            source_name, leases = "informer", binds.node_leases(api, namespace)
            LeaseCollector(
                source,
                [(leases, binds.kept), (pool_leases, in_flight.kept)],
                interval=max(COLLECT_SECONDS, 2 * waits.ttl_seconds),
            ).start()
        else:
            source, source_name, leases = FixedState(state), "snapshot", None
        return create_app(
            config,
            source,
            source_name=source_name,
            max_body_bytes=max_body_bytes,
            bind_guard=BindGuard(config, local, leases),
            storm_probes=probes,
            allocation_guard=allocations,
            require_client_cert=require_client_cert,
        )

    return app
