"""The policies that need no node state, as ValidatingAdmissionPolicy + binding (CEL).

They run inside the API server, so they hold even while the guard is down. A policy is
rendered when its module has a ``STATIC`` form (today only ``pinnedNodeName``: its verdict
depends on the object alone). The mode maps to the binding's ``validationActions``:
``enforce`` and ``fix`` deny (a template still pinned after mutation was not repaired),
``warn`` warns, ``audit`` audits, ``off`` renders nothing.

Whatever the webhooks let through must pass here too, or the static policy would deny what
the guard exempts: ``excludedNamespaces`` and the namespace opt-out label go into the binding's
namespace selector, and ``exemptions`` (namespace, user and group globs) into a match condition.
An exemption that CEL cannot express is an error, never silently dropped.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from .config import Config, Exemption
from .policies import Mode, Policy
from .policies.registry import POLICIES

OPT_OUT_LABEL = "admit-guard.io/skip"


class VapError(ValueError):
    """A part of the config the static policy cannot express; the message names it."""


ACTIONS = {Mode.ENFORCE: ["Deny"], Mode.FIX: ["Deny"], Mode.WARN: ["Warn"], Mode.AUDIT: ["Audit"]}
LABELS = {"app.kubernetes.io/name": "admit-guard"}


def policy_name(policy: Policy) -> str:
    """``pinnedNodeName`` -> ``admit-guard-pinned-node-name``."""
    return "admit-guard-" + re.sub(r"(?<!^)([A-Z])", r"-\1", policy.NAME).lower()


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


def match_conditions(config: Config, policy: str = "pinnedNodeName") -> list[dict[str, str]]:
    """The condition that skips exempted requests, as the engine skips them."""
    exempt = [
        _exempt(e, f"exemptions[{i}]")
        for i, e in enumerate(config.exemptions)
        if not e.policies or policy in e.policies
    ]
    if not exempt:
        return []
    return [{"name": "not-exempted", "expression": "!(" + " || ".join(f"({e})" for e in exempt) + ")"}]


def render(config: Config) -> list[dict[str, Any]]:
    """Each static policy and its binding, in registry order; nothing for a policy that is
    off. Raises ``VapError``."""
    rendered: list[dict[str, Any]] = []
    for policy in POLICIES:
        mode = config.mode(policy.NAME)
        if policy.STATIC is not None and mode != Mode.OFF:
            rendered += _render(policy, ACTIONS[mode], config)
    return rendered


def _render(policy: Policy, actions: list[str], config: Config) -> list[dict[str, Any]]:
    static, name = policy.STATIC, policy_name(policy)
    conditions = match_conditions(config, policy.NAME)
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": dict(LABELS)},
        "spec": {
            # A CEL error (an object this rule cannot read) must not block writes.
            "failurePolicy": "Ignore",
            "matchConstraints": {"resourceRules": copy.deepcopy(static.resource_rules)},
            **({"matchConditions": conditions} if conditions else {}),
            "variables": copy.deepcopy(static.variables),
            "validations": copy.deepcopy(static.validations),
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
        "metadata": {"name": name, "labels": dict(LABELS)},
        "spec": {
            "policyName": name,
            "validationActions": actions,
            "matchResources": {"namespaceSelector": {"matchExpressions": expressions}},
        },
    }
    return [validating, binding]
