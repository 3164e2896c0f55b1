"""``nodeports.Fits``: requested host ports must be free on the node. kubelet-admission-spec §7."""

from __future__ import annotations

from ..kube.ports import port_conflicts
from ..kube.reasons import NODE_PORTS
from .failure import Failure, predicate_failure


def host_port_conflict(pod, node, usage, kubelet=None) -> Failure | None:
    taken = [p for p in pod.record.host_ports if port_conflicts(p, usage.host_ports)]
    if not taken:
        return None
    ports = ", ".join(f"{ip}:{port}/{protocol}" for ip, protocol, port in taken)
    return predicate_failure(
        NODE_PORTS,
        "node(s) didn't have free ports for the requested pod ports",
        f"host port {ports} already in use on node {node.name}",
    )
