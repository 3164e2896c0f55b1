"""The built-in kinds of Kubernetes v1.35: the API versions the API server serves each in,
its scope, and the versions it was removed from.

``kubectl apply`` of an ``extensions/v1beta1`` Deployment fails with "no matches for kind";
a dry run must not pass it. A kind the table does not know (a custom resource) is not judged
here: its CRD decides. Versions served only behind a feature gate (beta and alpha APIs since
1.24) count as served: a cluster may enable them.

Upstream: the storage of each group in ``pkg/registry/*/rest`` and the API removals listed in
the Kubernetes deprecation guide.
"""

from __future__ import annotations

from dataclasses import dataclass

KUBERNETES = "1.35"


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    group: str  # "" for the core group
    versions: tuple[str, ...]  # served; the first is the stable one to suggest
    namespaced: bool

    @property
    def api_version(self) -> str:
        return _api_version(self.group, self.versions[0])


def _api_version(group: str, version: str) -> str:
    return f"{group}/{version}" if group else version


def _kinds(group: str, versions: tuple[str, ...], namespaced: str, cluster: str = "") -> list[Kind]:
    return [Kind(name, group, versions, True) for name in namespaced.split()] + [
        Kind(name, group, versions, False) for name in cluster.split()
    ]


_V1 = ("v1",)
_TABLE = [
    *_kinds(
        "",
        _V1,
        "Binding ConfigMap Endpoints Event LimitRange PersistentVolumeClaim Pod PodTemplate "
        "ReplicationController ResourceQuota Secret Service ServiceAccount",
        "ComponentStatus Namespace Node PersistentVolume",
    ),
    *_kinds(
        "admissionregistration.k8s.io",
        _V1,
        "",
        "MutatingWebhookConfiguration ValidatingWebhookConfiguration ValidatingAdmissionPolicy "
        "ValidatingAdmissionPolicyBinding",
    ),
    *_kinds(
        "admissionregistration.k8s.io",
        ("v1beta1", "v1alpha1"),
        "",
        "MutatingAdmissionPolicy MutatingAdmissionPolicyBinding",
    ),
    *_kinds("apiextensions.k8s.io", _V1, "", "CustomResourceDefinition"),
    *_kinds("apiregistration.k8s.io", _V1, "", "APIService"),
    *_kinds("apps", _V1, "ControllerRevision DaemonSet Deployment ReplicaSet StatefulSet"),
    *_kinds("authentication.k8s.io", _V1, "", "SelfSubjectReview TokenReview"),
    *_kinds(
        "authorization.k8s.io",
        _V1,
        "LocalSubjectAccessReview",
        "SelfSubjectAccessReview SelfSubjectRulesReview SubjectAccessReview",
    ),
    *_kinds("autoscaling", ("v2", "v1"), "HorizontalPodAutoscaler"),
    *_kinds("batch", _V1, "CronJob Job"),
    *_kinds("certificates.k8s.io", _V1, "", "CertificateSigningRequest"),
    *_kinds("certificates.k8s.io", ("v1beta1", "v1alpha1"), "PodCertificateRequest", "ClusterTrustBundle"),
    *_kinds("coordination.k8s.io", _V1, "Lease"),
    *_kinds("coordination.k8s.io", ("v1beta1", "v1alpha2"), "LeaseCandidate"),
    *_kinds("discovery.k8s.io", _V1, "EndpointSlice"),
    *_kinds("events.k8s.io", _V1, "Event"),
    *_kinds("flowcontrol.apiserver.k8s.io", _V1, "", "FlowSchema PriorityLevelConfiguration"),
    *_kinds("internal.apiserver.k8s.io", ("v1alpha1",), "", "StorageVersion"),
    *_kinds("networking.k8s.io", _V1, "Ingress NetworkPolicy", "IngressClass"),
    *_kinds("networking.k8s.io", ("v1", "v1beta1"), "", "IPAddress ServiceCIDR"),
    *_kinds("node.k8s.io", _V1, "", "RuntimeClass"),
    *_kinds("policy", _V1, "Eviction PodDisruptionBudget"),
    *_kinds("rbac.authorization.k8s.io", _V1, "Role RoleBinding", "ClusterRole ClusterRoleBinding"),
    *_kinds(
        "resource.k8s.io",
        ("v1", "v1beta2", "v1beta1"),
        "ResourceClaim ResourceClaimTemplate",
        "DeviceClass ResourceSlice",
    ),
    *_kinds("resource.k8s.io", ("v1alpha3",), "", "DeviceTaintRule"),
    *_kinds("scheduling.k8s.io", _V1, "", "PriorityClass"),
    *_kinds("scheduling.k8s.io", ("v1alpha1",), "Workload"),
    *_kinds("storage.k8s.io", _V1, "CSIStorageCapacity", "CSIDriver CSINode StorageClass VolumeAttachment"),
    *_kinds("storage.k8s.io", ("v1", "v1beta1"), "", "VolumeAttributesClass"),
    *_kinds("storagemigration.k8s.io", ("v1beta1", "v1alpha1"), "", "StorageVersionMigration"),
]
KINDS: dict[str, tuple[Kind, ...]] = {}  # Event is in two groups
for _kind in _TABLE:
    KINDS[_kind.name] = (*KINDS.get(_kind.name, ()), _kind)
GROUPS = frozenset({kind.group for kind in _TABLE} | {"extensions"})
_BY_LOWER = {name.lower(): kinds[0] for name, kinds in KINDS.items()}

# (group/version, kind) -> the release that stopped serving it.
_REMOVED: dict[tuple[str, str], str] = {
    **{
        (version, kind): "1.16"
        for version in ("extensions/v1beta1", "apps/v1beta1", "apps/v1beta2")
        for kind in ("Deployment", "DaemonSet", "ReplicaSet", "StatefulSet", "ControllerRevision")
    },
    ("extensions/v1beta1", "NetworkPolicy"): "1.16",
    **{(version, "Ingress"): "1.22" for version in ("extensions/v1beta1", "networking.k8s.io/v1beta1")},
    ("networking.k8s.io/v1beta1", "IngressClass"): "1.22",
    **{
        (f"{group}/v1beta1", kind): "1.22"
        for group, kinds in (
            ("admissionregistration.k8s.io", "MutatingWebhookConfiguration ValidatingWebhookConfiguration"),
            ("apiextensions.k8s.io", "CustomResourceDefinition"),
            ("apiregistration.k8s.io", "APIService"),
            ("authentication.k8s.io", "TokenReview"),
            ("authorization.k8s.io", "LocalSubjectAccessReview SelfSubjectAccessReview SubjectAccessReview"),
            ("certificates.k8s.io", "CertificateSigningRequest"),
            ("coordination.k8s.io", "Lease"),
            ("rbac.authorization.k8s.io", "ClusterRole ClusterRoleBinding Role RoleBinding"),
            ("storage.k8s.io", "CSIDriver CSINode StorageClass VolumeAttachment"),
        )
        for kind in kinds.split()
    },
    **{
        (version, kind): "1.25"
        for version, kind in (
            ("batch/v1beta1", "CronJob"),
            ("discovery.k8s.io/v1beta1", "EndpointSlice"),
            ("events.k8s.io/v1beta1", "Event"),
            ("autoscaling/v2beta1", "HorizontalPodAutoscaler"),
            ("policy/v1beta1", "PodDisruptionBudget"),
            ("node.k8s.io/v1beta1", "RuntimeClass"),
        )
    },
    ("autoscaling/v2beta2", "HorizontalPodAutoscaler"): "1.26",
    **{
        (f"flowcontrol.apiserver.k8s.io/{version}", kind): release
        for version, release in (("v1beta1", "1.26"), ("v1beta2", "1.29"), ("v1beta3", "1.32"))
        for kind in ("FlowSchema", "PriorityLevelConfiguration")
    },
    ("storage.k8s.io/v1beta1", "CSIStorageCapacity"): "1.27",
}
_GONE = {"PodSecurityPolicy": "1.25"}  # kinds removed altogether

# Custom resources the guard reads from cluster snapshots and the API (not built in: their CRD
# decides what ``api_problem`` says of them). NodeResourceTopology: the exporters' per-node NUMA
# view (NRT-API ``pkg/apis/topology/v1alpha2``), the topology manager check's input.
NODE_RESOURCE_TOPOLOGY = Kind("NodeResourceTopology", "topology.node.k8s.io", ("v1alpha2",), False)
READ_CUSTOM_KINDS = {NODE_RESOURCE_TOPOLOGY.name: NODE_RESOURCE_TOPOLOGY}


def api_problem(api_version: str, kind: str) -> tuple[str, str] | None:
    """Why the API server would not know ``kind`` in ``api_version``, as (field, message);
    None when it serves it, or when neither is built in (a custom resource)."""
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
    if group not in GROUPS:
        return None
    if kind in _GONE:
        return "kind", f"{kind} was removed in Kubernetes {_GONE[kind]}; no API server serves it"
    known = KINDS.get(kind)
    if not known:
        right = _BY_LOWER.get(kind.lower())
        if right is not None:
            return "kind", (
                f"{kind!r} is not a kind the API server knows: kinds are case-sensitive; "
                f"did you mean {right.name} ({right.api_version})?"
            )
        return None  # a kind of a built-in group this table does not list: left to the server
    served = {_api_version(k.group, version) for k in known for version in k.versions}
    if api_version in served:
        return None
    removed = _REMOVED.get((api_version, kind))
    when = f" (removed in Kubernetes {removed})" if removed else ""
    return "apiVersion", (
        f"the API server does not serve {kind} in {api_version}{when}: use apiVersion: {known[0].api_version}"
    )


def namespaced(api_version: str, kind: str) -> bool | None:
    """Whether a built-in kind lives in a namespace; None for kinds the table does not know."""
    known = KINDS.get(kind)
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
    if not known or group not in GROUPS:
        return None
    return known[0].namespaced
