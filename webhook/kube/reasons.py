"""The reasons the kubelet's admit handlers reject a pod with (kubelet-admission-spec §1).

The guard's checks deny with these strings, and ``rejection.py`` recognises the pods the
kubelet failed with them: both read them here, so the two cannot drift apart.
"""

from __future__ import annotations

# 1. eviction manager: also what the kubelet writes when it evicts a running pod.
EVICTED = "Evicted"
# 2. sysctl allowlist.
SYSCTL_FORBIDDEN = "SysctlForbidden"
# 3. topology manager scope, device/CPU/memory managers (and 4's critical-pod handler).
TOPOLOGY_AFFINITY_ERROR = "TopologyAffinityError"
SMT_ALIGNMENT_ERROR = "SMTAlignmentError"  # the CPU manager's Allocate, with full-pcpus-only
UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"
# 4. predicate handler.
POD_OS_SELECTOR_NODE_LABEL_DOES_NOT_MATCH = "PodOSSelectorNodeLabelDoesNotMatch"
POD_OS_NOT_SUPPORTED = "PodOSNotSupported"
SUPPLEMENTAL_GROUPS_POLICY_NOT_SUPPORTED = "SupplementalGroupsPolicyNotSupported"
OUT_OF = "OutOf"  # a family: OutOf<resource name>, e.g. OutOfcpu, OutOfnvidia.com/gpu
NODE_AFFINITY = "NodeAffinity"
NODE_NAME = "NodeName"
NODE_PORTS = "NodePorts"
TAINT_TOLERATION = "TaintToleration"
INVALID_NODE_INFO = "InvalidNodeInfo"
UNKNOWN_REASON = "UnknownReason"
UNEXPECTED_PREDICATE_FAILURE_TYPE = "UnexpectedPredicateFailureType"
# 5-8. AppArmor, pod features, declared features, node shutdown.
APP_ARMOR = "AppArmor"
POD_LEVEL_RESOURCES_NOT_SUPPORTED = "PodLevelResourcesNotSupported"
POD_FEATURE_UNSUPPORTED = "PodFeatureUnsupported"
NODE_SHUTDOWN = "NodeShutdown"


def out_of(resource: str) -> str:
    """The reason for a resource the node cannot fit: ``OutOfcpu``, ``OutOfnvidia.com/gpu``."""
    return OUT_OF + resource


def is_out_of(reason: str) -> bool:
    return reason.startswith(OUT_OF) and len(reason) > len(OUT_OF)
