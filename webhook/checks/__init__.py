"""Kubelet-equivalent admission checks, one module each, run in the kubelet's order by
``kubelet.kubelet_admission`` from the ``KUBELET_CHECKS`` table."""

from .failure import Failure
from .kubelet import KUBELET_CHECKS, Check, PodUnderReview, kubelet_admission

__all__ = ["KUBELET_CHECKS", "Check", "Failure", "PodUnderReview", "kubelet_admission"]
