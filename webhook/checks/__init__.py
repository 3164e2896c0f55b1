"""Kubelet-equivalent admission predicates, one module each, run in kubelet order by ``kubelet``."""

from .failure import Failure
from .kubelet import PodUnderReview, kubelet_admission

__all__ = ["Failure", "PodUnderReview", "kubelet_admission"]
