"""The kubelet's sysctl allowlist (``pkg/kubelet/sysctl/safe_sysctls.go``, ``allowlist.go``,
``component-helpers/node/util/sysctl``), as of Kubernetes v1.35.

A pod's sysctls must each be in the node kubelet's safe set or in its ``--allowed-unsafe-sysctls``
(names, or prefixes ending in ``*``); a ``net.*`` sysctl is refused with ``hostNetwork`` and an
IPC one with ``hostIPC``. The safe set depends on the kubelet's minor version and on the node's
kernel: a safe sysctl whose minimum kernel is not met is not allowed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

IPC, NET = "IPC", "Net"  # utilsysctl.Namespace strings, as the kubelet prints them


@dataclass(frozen=True, slots=True)
class SafeSysctl:
    name: str
    since_minor: int = 0  # the kubelet minor version (1.x) that made it safe
    min_kernel: tuple[int, ...] = ()


SAFE_SYSCTLS = (
    SafeSysctl("kernel.shm_rmid_forced"),
    SafeSysctl("net.ipv4.ip_local_port_range"),
    SafeSysctl("net.ipv4.tcp_syncookies"),
    SafeSysctl("net.ipv4.ping_group_range"),
    SafeSysctl("net.ipv4.ip_unprivileged_port_start"),
    SafeSysctl("net.ipv4.ip_local_reserved_ports", min_kernel=(3, 16)),
    SafeSysctl("net.ipv4.tcp_keepalive_time", min_kernel=(4, 5)),
    SafeSysctl("net.ipv4.tcp_fin_timeout", since_minor=29, min_kernel=(4, 6)),
    SafeSysctl("net.ipv4.tcp_keepalive_intvl", since_minor=29, min_kernel=(4, 5)),
    SafeSysctl("net.ipv4.tcp_keepalive_probes", since_minor=29, min_kernel=(4, 5)),
    SafeSysctl("net.ipv4.tcp_rmem", since_minor=32, min_kernel=(4, 15)),
    SafeSysctl("net.ipv4.tcp_wmem", since_minor=32, min_kernel=(4, 15)),
)
_NAMESPACES = {"kernel.sem": IPC}
_PREFIX_NAMESPACES = (("kernel.shm", IPC), ("kernel.msg", IPC), ("fs.mqueue.", IPC), ("net.", NET))
_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


def normalize(name: str) -> str:
    """``NormalizeName``: ``net/ipv4/conf/eno2.100/rp_filter`` → ``net.ipv4.conf.eno2/100.rp_filter``."""
    for c in name:
        if c == ".":
            return name
        if c == "/":
            return name.translate(str.maketrans("./", "/."))
    return name


def namespace_of(name: str) -> str | None:
    """``NamespacedBy``: the namespace isolating a sysctl (or prefix), None when none does."""
    if name in _NAMESPACES:
        return _NAMESPACES[name]
    return next((ns for prefix, ns in _PREFIX_NAMESPACES if name.startswith(prefix)), None)


def version(text: str | None) -> tuple[int, ...] | None:
    """``1.32.1`` / ``v1.32.1`` / ``6.8.0-45-generic`` → (1, 32, 1); None when unreadable."""
    match = _VERSION.match(text or "")
    if match is None:
        return None
    return tuple(int(part) for part in match.groups() if part is not None)


def safe_sysctls(kubelet_version: str | None, kernel_version: str | None) -> frozenset[str]:
    """The safe set of a node's kubelet; fields the node does not report mean the newest set."""
    kubelet, kernel = version(kubelet_version), version(kernel_version)
    minor = kubelet[1] if kubelet is not None and len(kubelet) > 1 else None
    return frozenset(
        s.name
        for s in SAFE_SYSCTLS
        if (minor is None or minor >= s.since_minor) and (kernel is None or kernel >= s.min_kernel)
    )


@dataclass(frozen=True, slots=True)
class Allowlist:
    """One node's allowed sysctls: exact names and ``*`` prefixes, each with its namespace."""

    names: frozenset[str]
    prefixes: tuple[str, ...]

    @classmethod
    def of(cls, safe: Iterable[str], unsafe: Iterable[str]) -> Allowlist:
        """``NewAllowlist``: patterns are normalized too (``net/core/somaxconn`` is allowed)."""
        names, prefixes = set(safe), []
        for entry in map(normalize, unsafe):
            if entry.endswith("*"):
                prefixes.append(entry[:-1])
            else:
                names.add(entry)
        return cls(frozenset(names), tuple(prefixes))

    def problem(self, name: str, host_network: bool, host_ipc: bool) -> str | None:
        """``validateSysctl``: the error text for one sysctl, None when it is allowed."""
        name = normalize(name)
        if name in self.names or any(name.startswith(p) for p in self.prefixes):
            namespace = namespace_of(name)
            if (namespace == IPC and host_ipc) or (namespace == NET and host_network):
                return f"{_quote(name)} not allowed with host {namespace} enabled"
            return None
        return f"{_quote(name)} not allowlisted"


def _quote(text: str) -> str:
    """Go's ``%q`` for the plain ASCII names sysctls are."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
