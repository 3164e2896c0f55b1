"""The policies that need no node state, as ValidatingAdmissionPolicy + binding (CEL).

They run inside the API server, so they hold even while the guard is down. Only
``pinnedNodeName`` is rendered: its verdict depends on the object alone. The mode maps to
the binding's ``validationActions``: ``enforce`` and ``fix`` deny (a template still pinned
after mutation was not repaired), ``warn`` warns, ``audit`` audits, ``off`` renders nothing.
"""

from __future__ import annotations

from typing import Any

from .config import Config

POLICY_NAME = "admit-guard-pinned-node-name"
ACTIONS = {"enforce": ["Deny"], "fix": ["Deny"], "warn": ["Warn"], "audit": ["Audit"]}


def _spec_of(root: str) -> str:
    """CEL for the pod template spec of any workload kind the engine recognises."""
    return (
        f"{root}.kind == 'CronJob' ? {root}.spec.jobTemplate.spec.template.spec : "
        f"{root}.kind == 'PodTemplate' ? {root}.template.spec : {root}.spec.template.spec"
    )


# An UPDATE that keeps the pin it already had stays allowed, as in the engine: existing
# objects must remain updatable (finalizers, labels, scale).
PINNED_EXPRESSION = (
    "!has(variables.spec.nodeName) || variables.spec.nodeName == '' || "
    "(request.operation == 'UPDATE' && has(variables.oldSpec.nodeName) && "
    "variables.oldSpec.nodeName == variables.spec.nodeName)"
)
PINNED_MESSAGE = (
    "object.kind + ' ' + object.metadata.namespace + '/' + object.metadata.name + "
    "' sets spec.nodeName to ' + variables.spec.nodeName + ' in its pod template: its pods skip the "
    "scheduler, and every pod the kubelet rejects is replaced at once. Pin the node with required node "
    "affinity on metadata.name or a nodeSelector on kubernetes.io/hostname instead.'"
)
WORKLOAD_RULES = [
    {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
     "resources": ["deployments", "replicasets", "statefulsets", "daemonsets"]},
    {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
     "resources": ["jobs", "cronjobs"]},
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
     "resources": ["replicationcontrollers", "podtemplates"]},
]  # fmt: skip


def render(config: Config) -> list[dict[str, Any]]:
    """The policy and its binding, or nothing when the policy is off."""
    mode = config.pinned_node_name.mode
    if mode == "off":
        return []
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME, "labels": {"app.kubernetes.io/name": "admit-guard"}},
        "spec": {
            # A CEL error (an object this rule cannot read) must not block writes.
            "failurePolicy": "Ignore",
            "matchConstraints": {"resourceRules": WORKLOAD_RULES},
            "variables": [
                {"name": "spec", "expression": _spec_of("object")},
                # Compared through the operation, not with null: UPDATE always has an oldObject.
                {
                    "name": "oldSpec",
                    "expression": f"request.operation == 'UPDATE' ? ({_spec_of('oldObject')}) : null",
                },
            ],
            "validations": [
                {"expression": PINNED_EXPRESSION, "messageExpression": PINNED_MESSAGE, "reason": "Forbidden"}
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME, "labels": {"app.kubernetes.io/name": "admit-guard"}},
        "spec": {
            "policyName": POLICY_NAME,
            "validationActions": ACTIONS[mode],
            "matchResources": {
                "namespaceSelector": {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": list(config.excluded_namespaces),
                        }
                    ]
                }
            },
        },
    }
    return [policy, binding]
