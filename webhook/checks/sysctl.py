"""The kubelet's sysctl admit handler (``pkg/kubelet/sysctl/allowlist.go``). kubelet-admission-spec §12.

Handler 2 in the kubelet's order, after the eviction manager: the first sysctl the node's
allowlist refuses rejects the pod with ``SysctlForbidden``.
"""

from __future__ import annotations

from functools import lru_cache

from ..kube.reasons import SYSCTL_FORBIDDEN
from ..kube.sysctls import Allowlist, safe_sysctls
from .failure import Failure


@lru_cache(maxsize=256)
def node_allowlist(
    kubelet_version: str, kernel_version: str, unsafe: tuple[str, ...], linux: bool = True
) -> Allowlist:
    """``SafeSysctlAllowlist`` is empty off Linux: there only the allowed unsafe ones pass."""
    safe = safe_sysctls(kubelet_version or None, kernel_version or None) if linux else ()
    return Allowlist.of(safe, unsafe)


def pod_sysctls(spec) -> list[str]:
    context = spec.get("securityContext")
    sysctls = context.get("sysctls") if isinstance(context, dict) else None
    if not isinstance(sysctls, list):
        return []
    return [s["name"] for s in sysctls if isinstance(s, dict) and isinstance(s.get("name"), str)]


def forbidden_sysctl(pod, node, usage=None, kubelet=None) -> Failure | None:
    """``patternAllowlist.Admit``: the first sysctl this node's kubelet would refuse;
    ``kubelet``: its ``KubeletConfig`` (the allowed unsafe sysctls)."""
    names = pod_sysctls(pod.spec)
    if not names:
        return None
    unsafe_sysctls = kubelet.unsafe_sysctls if kubelet is not None else ()
    linux = node.operating_system == "linux"
    allowlist = node_allowlist(node.kubelet_version, node.kernel_version, unsafe_sysctls, linux)
    host_network, host_ipc = pod.spec.get("hostNetwork") is True, pod.spec.get("hostIPC") is True
    for name in names:
        problem = allowlist.problem(name, host_network, host_ipc)
        if problem is not None:
            hint = (
                f"node {node.name} (kubelet {node.kubelet_version or 'unknown'}, kernel "
                f"{node.kernel_version or 'unknown'}) does not allow it; allow it with the kubelet's "
                "--allowed-unsafe-sysctls and nodeAdmission.allowedUnsafeSysctls, or drop it"
            )
            return Failure(SYSCTL_FORBIDDEN, f"forbidden sysctl: {problem}", hint)
    return None
