"""The guard's configuration: one YAML file, validated with errors that name the field."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import yaml

from .manifests import StrictLoader

MODES = ("enforce", "warn", "audit", "fix", "off")
DEFAULT_DEVICE_PATTERNS = ("nvidia.com/*", "amd.com/*", "intel.com/*", "gpu.intel.com/*")


class ConfigError(ValueError):
    """Invalid configuration; the message starts with the source and the field path."""


@lru_cache(maxsize=4096)
def matches_any(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``name`` matches one of the globs: every review asks again for the same few
    resource names against the same patterns."""
    return any(fnmatchcase(name, p) for p in patterns)


@dataclass(frozen=True, slots=True)
class PinnedNodeNameConfig:
    mode: str = "enforce"


@dataclass(frozen=True, slots=True)
class DeviceSchedulerConfig:
    mode: str = "enforce"
    resources: tuple[str, ...] = DEFAULT_DEVICE_PATTERNS
    owners: tuple[tuple[str, str], ...] = ()  # (resource name or pattern, scheduler)
    annotations: tuple[tuple[str, str], ...] = ()  # (annotation key, scheduler)
    autodetect: bool = True
    binders: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (resource pattern, identity globs)

    def allowed_binders(self, resource: str) -> tuple[str, ...] | None:
        return next((who for p, who in self.binders if fnmatchcase(resource, p)), None)

    def is_device(self, resource: str) -> bool:
        return matches_any(resource, self.resources) or matches_any(
            resource, tuple(p for p, _ in self.owners)
        )

    def configured_owner(self, resource: str) -> str | None:
        return next((owner for p, owner in self.owners if fnmatchcase(resource, p)), None)


@dataclass(frozen=True, slots=True)
class UnsafeSysctls:
    """A kubelet's ``--allowed-unsafe-sysctls`` for the nodes whose labels match ``node_selector``."""

    node_selector: tuple[tuple[str, str], ...]
    sysctls: tuple[str, ...]  # names, or prefixes ending in ``*``

    def applies_to(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.node_selector)


@dataclass(frozen=True, slots=True)
class ReservationsConfig:
    """How allowed binds hold capacity until the watch shows the pod bound."""

    namespace: str = ""  # coordination Leases live here; "" means the guard's own namespace
    ttl_seconds: float = 30.0
    deadline_seconds: float = 1.0
    coordinate: tuple[str, ...] | None = None  # None: deviceScheduler.resources

    def coordinated(self, resource: str, device_patterns: tuple[str, ...]) -> bool:
        return matches_any(resource, self.coordinate if self.coordinate is not None else device_patterns)


@dataclass(frozen=True, slots=True)
class NodeAdmissionConfig:
    mode: str = "enforce"
    unknown_node: str = "deny"
    allowed_unsafe_sysctls: tuple[UnsafeSysctls, ...] = ()
    reservations: ReservationsConfig = field(default_factory=ReservationsConfig)

    def unsafe_sysctls_for(self, labels: Mapping[str, str]) -> tuple[str, ...]:
        """The unsafe sysctls the kubelet of a node with these labels allows."""
        if not self.allowed_unsafe_sysctls:
            return ()
        return tuple(
            name
            for entry in self.allowed_unsafe_sysctls
            if entry.applies_to(labels)
            for name in entry.sysctls
        )


@dataclass(frozen=True, slots=True)
class StormBreakerConfig:
    mode: str = "enforce"
    threshold: int = 20
    window_seconds: float = 300.0
    cooldown_seconds: float = 120.0


@dataclass(frozen=True, slots=True)
class Exemption:
    """Skips the listed policies (all when empty) for requests that match every given field."""

    namespaces: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    policies: tuple[str, ...] = ()

    def covers(self, policy: str, namespace: str, user: str, groups: tuple[str, ...]) -> bool:
        if self.policies and policy not in self.policies:
            return False
        if self.namespaces and not any(fnmatchcase(namespace, p) for p in self.namespaces):
            return False
        if self.users and not any(fnmatchcase(user, p) for p in self.users):
            return False
        return not self.groups or any(fnmatchcase(g, p) for g in groups for p in self.groups)


@dataclass(frozen=True, slots=True)
class ClientAuth:
    """Who may call the admission paths: clients whose certificate ``ca`` signed, and (when
    ``common_names`` is not empty) whose subject common name is one of them."""

    ca: str
    common_names: tuple[str, ...] = ()

    def allows(self, names: tuple[str, ...]) -> bool:
        """Whether a verified certificate with these subject common names may call."""
        return not self.common_names or any(name in self.common_names for name in names)


@dataclass(frozen=True, slots=True)
class Config:
    excluded_namespaces: tuple[str, ...] = ("kube-system",)
    fail_open: bool = True
    exemptions: tuple[Exemption, ...] = ()
    pinned_node_name: PinnedNodeNameConfig = field(default_factory=PinnedNodeNameConfig)
    device_scheduler: DeviceSchedulerConfig = field(default_factory=DeviceSchedulerConfig)
    node_admission: NodeAdmissionConfig = field(default_factory=NodeAdmissionConfig)
    storm_breaker: StormBreakerConfig = field(default_factory=StormBreakerConfig)
    client_auth: ClientAuth | None = None  # serve only; ``--client-ca`` overrides it

    def mode(self, policy: str) -> str:
        return {
            "pinnedNodeName": self.pinned_node_name.mode,
            "deviceScheduler": self.device_scheduler.mode,
            "nodeAdmission": self.node_admission.mode,
            "stormBreaker": self.storm_breaker.mode,
        }[policy]

    def exempts(self, policy: str, namespace: str, user: str, groups: tuple[str, ...]) -> bool:
        """Whether an exemption lifts ``policy`` for this namespace and requester."""
        return any(e.covers(policy, namespace, user, groups) for e in self.exemptions)


POLICY_NAMES = ("pinnedNodeName", "deviceScheduler", "nodeAdmission", "stormBreaker")


def load_config(path: str | Path) -> Config:
    """Read and validate a config file."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    try:
        data = yaml.load(text, Loader=StrictLoader)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML: {err}") from None
    return config_from_dict(data if data is not None else {}, str(path))


def config_from_dict(data: Any, source: str = "config") -> Config:
    """Validate a decoded config document; unknown keys are errors (they are usually typos)."""
    reader = _Reader(source)
    top = reader.mapping(data, "", {"excludedNamespaces", "failOpen", "exemptions", "policies", "clientAuth"})
    policies = reader.mapping(top.get("policies") or {}, "policies", set(POLICY_NAMES))
    config = Config(
        excluded_namespaces=reader.strings(
            top.get("excludedNamespaces", ["kube-system"]), "excludedNamespaces"
        ),
        fail_open=reader.boolean(top.get("failOpen", True), "failOpen", True),
        exemptions=tuple(
            _exemption(reader, item, f"exemptions[{i}]")
            for i, item in enumerate(reader.sequence(top.get("exemptions") or [], "exemptions"))
        ),
        pinned_node_name=_pinned(reader, _policy(reader, policies, "pinnedNodeName")),
        device_scheduler=_device(reader, _policy(reader, policies, "deviceScheduler")),
        node_admission=_node(reader, _policy(reader, policies, "nodeAdmission")),
        storm_breaker=_storm(reader, _policy(reader, policies, "stormBreaker")),
        client_auth=_client_auth(reader, top.get("clientAuth")),
    )
    reader.finish()
    return config


def _policy(reader: _Reader, policies: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A policy's settings. A bare ``off`` (YAML 1.1 reads it as false) means ``{mode: off}``."""
    data = policies.get(name)
    if data is None:
        return {}
    if data is False or data == "off":
        return {"mode": "off"}
    if not isinstance(data, Mapping):
        shown = "true (YAML reads a bare on/yes/true as true)" if data is True else repr(data)
        reader.fail(
            f"policies.{name}", f"{shown} is not a policy setting: write off or a mapping like {{mode: warn}}"
        )
        return {}
    return data


def _client_auth(reader: _Reader, data: Any) -> ClientAuth | None:
    if data is None:
        return None
    item = reader.mapping(data, "clientAuth", {"ca", "commonNames"})
    ca = item.get("ca")
    if not isinstance(ca, str) or not ca:
        reader.fail(
            "clientAuth.ca", "must be the path of the CA file that signs the API server's client certificate"
        )
        ca = ""
    return ClientAuth(ca, reader.strings(item.get("commonNames") or [], "clientAuth.commonNames"))


def _exemption(reader: _Reader, data: Any, where: str) -> Exemption:
    item = reader.mapping(data, where, {"namespaces", "users", "groups", "policies"})
    policies = reader.strings(item.get("policies", []), f"{where}.policies")
    for name in policies:
        if name not in POLICY_NAMES:
            reader.fail(f"{where}.policies", f"unknown policy {name!r} (one of {', '.join(POLICY_NAMES)})")
    exemption = Exemption(
        namespaces=reader.strings(item.get("namespaces", []), f"{where}.namespaces"),
        users=reader.strings(item.get("users", []), f"{where}.users"),
        groups=reader.strings(item.get("groups", []), f"{where}.groups"),
        policies=policies,
    )
    if not (exemption.namespaces or exemption.users or exemption.groups):
        reader.fail(where, "needs at least one of namespaces, users, groups")
    return exemption


def _mode(reader: _Reader, data: Mapping[str, Any], where: str, allowed=MODES) -> str:
    mode = data.get("mode", "enforce")
    if mode is False:
        return "off"  # YAML 1.1 reads a bare ``off`` as false
    if mode is True:
        reader.fail(
            f"{where}.mode",
            f"true is not a mode: YAML reads a bare on/yes/true as true; write one of {', '.join(allowed)}",
        )
        return "enforce"
    if mode not in allowed:
        reader.fail(f"{where}.mode", f"{mode!r} is not one of {', '.join(allowed)}")
        return "enforce"
    return mode


def _pinned(reader: _Reader, data: Any) -> PinnedNodeNameConfig:
    where = "policies.pinnedNodeName"
    data = reader.mapping(data, where, {"mode"})
    return PinnedNodeNameConfig(mode=_mode(reader, data, where))


def _node(reader: _Reader, data: Any) -> NodeAdmissionConfig:
    where = "policies.nodeAdmission"
    data = reader.mapping(data, where, {"mode", "unknownNode", "allowedUnsafeSysctls", "reservations"})
    unknown = data.get("unknownNode", "deny")
    if unknown not in ("deny", "allow"):
        reader.fail(f"{where}.unknownNode", f"{unknown!r} is not one of deny, allow")
    mode = _mode(reader, data, where, tuple(m for m in MODES if m != "fix"))
    entries = reader.sequence(data.get("allowedUnsafeSysctls") or [], f"{where}.allowedUnsafeSysctls")
    return NodeAdmissionConfig(
        mode=mode,
        unknown_node=unknown,
        reservations=_reservations(reader, data.get("reservations") or {}, f"{where}.reservations"),
        allowed_unsafe_sysctls=tuple(
            _unsafe_sysctls(reader, entry, f"{where}.allowedUnsafeSysctls[{i}]")
            for i, entry in enumerate(entries)
        ),
    )


def _reservations(reader: _Reader, data: Any, where: str) -> ReservationsConfig:
    data = reader.mapping(data, where, {"namespace", "ttlSeconds", "deadlineSeconds", "coordinate"})
    defaults = ReservationsConfig()
    namespace = data.get("namespace", "")
    if not isinstance(namespace, str):
        reader.fail(f"{where}.namespace", "must be a namespace name")
        namespace = ""
    coordinate = data.get("coordinate")
    return ReservationsConfig(
        namespace=namespace,
        ttl_seconds=reader.number(data.get("ttlSeconds", defaults.ttl_seconds), f"{where}.ttlSeconds", 1),
        deadline_seconds=reader.number(
            data.get("deadlineSeconds", defaults.deadline_seconds), f"{where}.deadlineSeconds", 0.05
        ),
        coordinate=None if coordinate is None else reader.strings(coordinate, f"{where}.coordinate"),
    )


def _unsafe_sysctls(reader: _Reader, data: Any, where: str) -> UnsafeSysctls:
    from .kube.sysctls import namespace_of, normalize

    data = reader.mapping(data, where, {"nodeSelector", "sysctls"})
    selector = reader.mapping(data.get("nodeSelector") or {}, f"{where}.nodeSelector")
    if not all(isinstance(v, str) for v in selector.values()):
        reader.fail(f"{where}.nodeSelector", "label values must be strings")
    sysctls = reader.strings(data.get("sysctls") or [], f"{where}.sysctls")
    for name in sysctls:
        # The kubelet refuses to start with a sysctl that no pod namespace isolates.
        if namespace_of(normalize(name).removesuffix("*")) is None:
            reader.fail(f"{where}.sysctls", f"{name!r} is not a namespaced sysctl (kubelets refuse it)")
    return UnsafeSysctls(tuple((str(k), str(v)) for k, v in selector.items()), sysctls)


def _storm(reader: _Reader, data: Any) -> StormBreakerConfig:
    where = "policies.stormBreaker"
    data = reader.mapping(data, where, {"mode", "threshold", "windowSeconds", "cooldownSeconds"})
    defaults = StormBreakerConfig()
    return StormBreakerConfig(
        mode=_mode(reader, data, where, tuple(m for m in MODES if m != "fix")),
        threshold=int(reader.number(data.get("threshold", defaults.threshold), f"{where}.threshold", 1)),
        window_seconds=reader.number(
            data.get("windowSeconds", defaults.window_seconds), f"{where}.windowSeconds", 1
        ),
        cooldown_seconds=reader.number(
            data.get("cooldownSeconds", defaults.cooldown_seconds), f"{where}.cooldownSeconds", 0.001
        ),
    )


def _device(reader: _Reader, data: Any) -> DeviceSchedulerConfig:
    where = "policies.deviceScheduler"
    data = reader.mapping(
        data, where, {"mode", "resources", "owners", "annotations", "autodetect", "binders"}
    )
    binders = tuple(
        (str(resource), reader.strings(who, f"{where}.binders.{resource}"))
        for resource, who in reader.mapping(data.get("binders") or {}, f"{where}.binders").items()
    )
    resources = reader.strings(data.get("resources", list(DEFAULT_DEVICE_PATTERNS)), f"{where}.resources")
    owners = tuple(reader.mapping(data.get("owners") or {}, f"{where}.owners").items())
    annotations = tuple(reader.mapping(data.get("annotations") or {}, f"{where}.annotations").items())
    for key, owner in (*owners, *annotations):
        if not isinstance(owner, str) or not owner:
            reader.fail(f"{where}.owners.{key}", "the owner must be a scheduler name")
    for pattern in (*resources, *(p for p, _ in owners)):
        if "[" in pattern:
            reader.fail(f"{where}", f"pattern {pattern!r}: only * and ? wildcards are supported")
    for i, (first, first_owner) in enumerate(owners):
        for second, second_owner in owners[i + 1 :]:
            if first_owner != second_owner and globs_overlap(first, second):
                reader.fail(
                    f"{where}.owners",
                    f"{first!r} (owner {first_owner}) and {second!r} (owner {second_owner}) "
                    "match the same resource; a resource can have only one owner",
                )
    return DeviceSchedulerConfig(
        mode=_mode(reader, data, where),
        resources=resources,
        owners=owners,
        annotations=annotations,
        autodetect=reader.boolean(data.get("autodetect", True), f"{where}.autodetect", True),
        binders=binders,
    )


def globs_overlap(first: str, second: str) -> bool:
    """Whether some string matches both ``*``/``?`` glob patterns."""

    @cache
    def meet(i: int, j: int) -> bool:
        if i == len(first) and j == len(second):
            return True
        if i < len(first) and first[i] == "*":
            return meet(i + 1, j) or (j < len(second) and meet(i, j + 1))
        if j < len(second) and second[j] == "*":
            return meet(i, j + 1) or (i < len(first) and meet(i + 1, j))
        if i == len(first) or j == len(second):
            return False
        return (first[i] == second[j] or "?" in (first[i], second[j])) and meet(i + 1, j + 1)

    return meet(0, 0)


class _Reader:
    """Type checks that record a problem naming the field, then carry on with a safe value,
    so one run lists every problem of a config (``finish`` raises them together)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[str] = []

    def fail(self, where: str, message: str) -> None:
        self.problems.append(f"{where or 'top level'}: {message}")

    def finish(self) -> None:
        if len(self.problems) == 1:
            raise ConfigError(f"{self.source}: {self.problems[0]}")
        if self.problems:
            listed = "\n  ".join(self.problems)
            raise ConfigError(f"{self.source}: {len(self.problems)} problems:\n  {listed}")

    def mapping(self, data: Any, where: str, allowed: set[str] | None = None) -> Mapping[str, Any]:
        if not isinstance(data, Mapping):
            self.fail(where, "must be a mapping")
            return {}
        if allowed is not None:
            for key in data:
                if key not in allowed:
                    self.fail(
                        f"{where}.{key}" if where else str(key),
                        f"unknown field (expected one of {', '.join(sorted(allowed))})",
                    )
        return data

    def sequence(self, data: Any, where: str) -> list[Any]:
        if not isinstance(data, list):
            self.fail(where, "must be a list")
            return []
        return data

    def strings(self, data: Any, where: str) -> tuple[str, ...]:
        items = self.sequence(data, where)
        if not all(isinstance(s, str) for s in items):
            self.fail(where, "must be a list of strings")
            return ()
        return tuple(items)

    def number(self, data: Any, where: str, minimum: float) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float) or data < minimum:
            self.fail(where, f"must be a number >= {minimum:g}")
            return minimum
        return float(data)

    def boolean(self, data: Any, where: str, default: bool) -> bool:
        if not isinstance(data, bool):
            self.fail(where, "must be true or false")
            return default
        return data
