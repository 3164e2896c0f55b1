"""Host ports (``scheduler/util/utils.go`` ``GetHostPorts``, ``HostPortInfo.CheckConflict``).
kubelet-admission-spec §7."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .errors import MAPPING, FieldError
from .resources import containers, is_sidecar

HostPort = tuple[str, str, int]  # (hostIP, protocol, hostPort)
WILDCARD = "0.0.0.0"


def host_ports(spec: Mapping[str, Any]) -> tuple[HostPort, ...]:
    """Host ports of app containers and sidecars; regular init containers never hold ports."""
    found: list[HostPort] = []
    for key in ("containers", "initContainers"):
        for i, container in enumerate(containers(spec, key)):
            ports = container.get("ports")
            if not ports or (key == "initContainers" and not is_sidecar(container)):
                continue
            if not isinstance(ports, list):
                raise FieldError(f"spec.{key}[{i}].ports", "must be a list")
            found += _container_host_ports(ports, f"spec.{key}[{i}].ports")
    return tuple(found)


def _container_host_ports(ports: list[Any], field: str) -> Iterator[HostPort]:
    for j, port in enumerate(ports):
        if not isinstance(port, MAPPING):
            raise FieldError(f"{field}[{j}]", "must be a mapping")
        number = port.get("hostPort") or 0
        if not isinstance(number, int) or isinstance(number, bool):
            raise FieldError(f"{field}[{j}].hostPort", "must be an integer")
        if number > 0:
            yield (port.get("hostIP") or WILDCARD, port.get("protocol") or "TCP", number)


def port_conflicts(wanted: HostPort, used: Mapping[HostPort, int]) -> bool:
    """A wildcard IP conflicts with the port on any IP; a specific IP with itself or 0.0.0.0."""
    ip, protocol, port = wanted
    if ip == WILDCARD:
        return any(p == port and proto == protocol for (_, proto, p) in used)
    return (ip, protocol, port) in used or (WILDCARD, protocol, port) in used
