"""The policies, in the order the engine runs them: adding a policy is adding its module here.

Order matters where a policy fixes what a later one judges: the engine re-reads the object
after each fix, so ``deviceScheduler`` sees the template ``pinnedNodeName`` repaired.
"""

from __future__ import annotations

from . import (
    ALLOCATIONS,
    BINDS,
    Policy,
    device_allocation,
    device_scheduler,
    node_admission,
    pinned_node_name,
    storm_breaker,
)

POLICIES: tuple[Policy, ...] = (
    pinned_node_name,
    device_scheduler,
    node_admission,
    storm_breaker,
    device_allocation,
)
NAMES = tuple(policy.NAME for policy in POLICIES)
# The policies with a hook for a path, in registry order: what the guards iterate.
BIND_POLICIES = tuple(policy for policy in POLICIES if hasattr(policy, "check_bind"))
ALLOCATION_POLICIES = tuple(policy for policy in POLICIES if hasattr(policy, "check_allocation"))
# The audit's order, which its report keeps (the summary's types; among findings equally severe
# and many, the first first): storms lead, their damage is done; then the registry's order.
AUDIT_POLICIES = (
    storm_breaker,
    *(policy for policy in POLICIES if hasattr(policy, "audit") and policy is not storm_breaker),
)
STATELESS_POLICIES = tuple(policy for policy in POLICIES if hasattr(policy, "check_stateless"))
EXPLAIN_POLICIES = tuple(policy for policy in POLICIES if hasattr(policy, "explain"))


def coordinator(path: str) -> Policy:
    """The policy that declares ``COORDINATES = path``: exactly one must."""
    (policy,) = (p for p in POLICIES if getattr(p, "COORDINATES", None) == path)
    return policy


BIND_COORDINATOR = coordinator(BINDS)
ALLOCATION_COORDINATOR = coordinator(ALLOCATIONS)
