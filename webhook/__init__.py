"""admit-guard: a Kubernetes admission guard that refuses what the kubelet would refuse.

Kubernetes semantics follow upstream Kubernetes v1.35 (kubelet admission as re-specified in
the project's kubelet-admission-spec); see README for the rules and their sources.
"""

KUBERNETES_VERSION = "v1.35"
