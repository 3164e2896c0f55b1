"""Cluster state: nodes, compact pod records and per-node aggregates."""

from .model import ClusterState, Node, NodeUsage, PodRecord, node_from, pod_record

__all__ = ["ClusterState", "Node", "NodeUsage", "PodRecord", "node_from", "pod_record"]
