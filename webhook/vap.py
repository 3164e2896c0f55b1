"""The policies that need no node state, as ValidatingAdmissionPolicy + binding (CEL).

They run inside the API server, so they hold even while the guard is down. Only
``pinnedNodeName`` is rendered: its verdict depends on the object alone. The mode maps to
the binding's ``validationActions``: ``enforce`` and ``fix`` deny (a template still pinned
after mutation was not repaired), ``warn`` warns, ``audit`` audits, ``off`` renders nothing.

Whatever the webhooks let through must pass here too, or the static policy would deny what
the guard exempts: ``excludedNamespaces`` and the namespace opt-out label go into the binding's
namespace selector, and ``exemptions`` (namespace, user and group globs) into a match condition.
An exemption that CEL cannot express is an error, never silently dropped.
"""

from __future__ import annotations

from typing import Any

from .config import Config, Exemption

OPT_OUT_LABEL = "admit-guard.io/skip"


class VapError(ValueError):
    """A part of the config the static policy cannot express; the message names it."""


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


def _pattern(glob: str, where: str) -> str:
    """A ``*``/``?`` glob as a quoted CEL string holding an anchored RE2 pattern."""
    if any(c in glob for c in "\\]^'\""):
        raise VapError(f"{where}: {glob!r} has a character the rendered CEL cannot quote")
    body = "".join(".*" if c == "*" else "." if c == "?" else c if c.isalnum() else f"[{c}]" for c in glob)
    return f"'^{body}$'"


def _exempt(exemption: Exemption, where: str) -> str:
    """CEL true when a request matches every field of one exemption (as ``Exemption.covers``)."""
    parts = []
    if exemption.namespaces:
        namespaces = [
            f"request.namespace.matches({_pattern(p, f'{where}.namespaces')})" for p in exemption.namespaces
        ]
        parts.append("(" + " || ".join(namespaces) + ")")
    if exemption.users:
        users = [
            f"request.userInfo.username.matches({_pattern(p, f'{where}.users')})" for p in exemption.users
        ]
        parts.append("(" + " || ".join(users) + ")")
    if exemption.groups:
        groups = " || ".join(f"g.matches({_pattern(p, f'{where}.groups')})" for p in exemption.groups)
        parts.append(f"(has(request.userInfo.groups) && request.userInfo.groups.exists(g, {groups}))")
    return " && ".join(parts)


def match_conditions(config: Config) -> list[dict[str, str]]:
    """The condition that skips exempted requests, as the engine skips them."""
    exempt = [
        _exempt(e, f"exemptions[{i}]")
        for i, e in enumerate(config.exemptions)
        if not e.policies or "pinnedNodeName" in e.policies
    ]
    if not exempt:
        return []
    return [{"name": "not-exempted", "expression": "!(" + " || ".join(f"({e})" for e in exempt) + ")"}]


def render(config: Config) -> list[dict[str, Any]]:
    """The policy and its binding, or nothing when the policy is off. Raises ``VapError``."""
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
            **({"matchConditions": conditions} if (conditions := match_conditions(config)) else {}),
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
    # The webhooks' opt-out: a label only the namespace's owner can set.
    expressions = [{"key": OPT_OUT_LABEL, "operator": "NotIn", "values": ["true"]}]
    if config.excluded_namespaces:  # the API server rejects NotIn with no values
        names = list(config.excluded_namespaces)
        expressions.insert(0, {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": names})
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME, "labels": {"app.kubernetes.io/name": "admit-guard"}},
        "spec": {
            "policyName": POLICY_NAME,
            "validationActions": ACTIONS[mode],
            "matchResources": {"namespaceSelector": {"matchExpressions": expressions}},
        },
    }
    return [policy, binding]
