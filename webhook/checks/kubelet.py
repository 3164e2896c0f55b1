"""The kubelet's admission of one pod on one node, in the kubelet's order (spec §14)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..kube.workloads import PodShape
from ..state.model import Node, NodeUsage, PodRecord, pod_record
from .failure import Failure
from .node_affinity import node_affinity_mismatch
from .node_name import node_name_mismatch
from .node_ports import host_port_conflict
from .node_pressure import node_pressure
from .operating_system import os_field_mismatch, os_label_mismatch
from .preemption import critical_pod_failures
from .resource_fit import insufficient_resources
from .supplemental_groups import supplemental_groups_unsupported
from .sysctl import forbidden_sysctl
from .taint_toleration import untolerated_no_execute_taint


@dataclass(frozen=True, slots=True)
class PodUnderReview:
    """The incoming pod (or the pod a template would create), with its record computed once."""

    metadata: Mapping[str, Any]
    spec: Mapping[str, Any]
    record: PodRecord

    @classmethod
    def from_shape(cls, shape: PodShape) -> PodUnderReview:
        record = pod_record({"metadata": shape.metadata, "spec": shape.spec})
        assert record is not None  # no status, so never terminal
        return cls(shape.metadata, shape.spec, record)


def kubelet_admission(
    pod: PodUnderReview, node: Node, usage: NodeUsage, unsafe_sysctls: tuple[str, ...] = ()
) -> list[Failure]:
    """Every reason the kubelet on ``node`` would reject ``pod``; the first is what it reports.

    ``unsafe_sysctls``: the node kubelet's ``--allowed-unsafe-sysctls`` (from the config).
    Order: eviction manager, sysctls, OS label, OS field, supplemental groups, then the general filter
    (resources, node affinity, node name, host ports, NoExecute taints) with the critical-pod
    rule applied to the general filter's failures only, as ``predicateAdmitHandler.Admit`` does.
    """
    usage = usage.without(pod.record.key)
    failures = [
        f
        for f in (
            node_pressure(pod, node),
            forbidden_sysctl(pod, node, unsafe_sysctls),
            os_label_mismatch(pod, node),
            os_field_mismatch(pod, node),
            supplemental_groups_unsupported(pod, node),
        )
        if f is not None
    ]
    general = insufficient_resources(pod.record.requests, node, usage)
    general += [
        f
        for f in (
            node_affinity_mismatch(pod, node),
            node_name_mismatch(pod, node),
            host_port_conflict(pod, node, usage),
            untolerated_no_execute_taint(pod, node),
        )
        if f is not None
    ]
    return failures + critical_pod_failures(pod.record, general, usage.pods.values())
