"""The guard's configuration: one YAML file, validated with errors that name the field.

The top level is the guard's own (namespaces, failOpen, exemptions); each key of
``policies:`` belongs to a policy in ``policies.registry`` and is read by that policy's own
``read_settings``. ``Config.policy(name)`` is a policy's settings; the policies that other
modules read by attribute (``config.node_admission.reservations``) keep their attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .formats.reader import Reader, ReadError, load_yaml
from .globs import globs_overlap, matches_any
from .kube.workloads import BUILT_IN, FieldPath, WorkloadKind, WorkloadTable, is_built_in
from .policies import ALL_MODES as MODES
from .policies import Mode
from .policies.device_scheduler import DEFAULT_DEVICE_PATTERNS, DeviceSchedulerConfig
from .policies.node_admission import NodeAdmissionConfig, ReservationsConfig, TopologyConfig, UnsafeSysctls
from .policies.pinned_node_name import PinnedNodeNameConfig
from .policies.registry import NAMES, POLICIES
from .policies.storm_breaker import StormBreakerConfig

if TYPE_CHECKING:
    from .checks.kubelet import KubeletConfig
    from .state.model import Node

# Names other modules import from here; each is defined next to the policy it configures.
__all__ = [
    "DEFAULT_DEVICE_PATTERNS",
    "MODES",
    "POLICY_NAMES",
    "Config",
    "ConfigError",
    "DeviceSchedulerConfig",
    "Exemption",
    "NodeAdmissionConfig",
    "PinnedNodeNameConfig",
    "ReservationsConfig",
    "StormBreakerConfig",
    "UnsafeSysctls",
    "config_from_dict",
    "globs_overlap",
    "load_config",
    "matches_any",
    "read_config",
]

POLICY_NAMES = NAMES
_POSITION = {name: i for i, name in enumerate(NAMES)}


class ConfigError(ReadError):
    """Invalid configuration; the message starts with the source and the field path."""


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


def _default_settings() -> tuple[Any, ...]:
    return tuple(policy.Settings() for policy in POLICIES)


@dataclass(frozen=True, slots=True)
class ClientAuth:
    """Who may call the admission paths: clients whose certificate ``ca`` signed, and (when
    ``common_names`` is not empty) whose name is one of them. A certificate's name is the last
    common name of its subject: Kubernetes' x509 authenticator reads ``Subject.CommonName``,
    which Go fills from each CN attribute in turn, so the last one wins."""

    ca: str
    common_names: tuple[str, ...] = ()

    def allows(self, name: str | None) -> bool:
        """Whether a verified certificate named ``name`` (None: no common name) may call."""
        return not self.common_names or name in self.common_names


@dataclass(frozen=True, slots=True)
class Config:
    excluded_namespaces: tuple[str, ...] = ("kube-system",)
    fail_open: bool = True
    exemptions: tuple[Exemption, ...] = ()
    # Each policy's settings, in ``POLICIES`` order.
    settings: tuple[Any, ...] = field(default_factory=_default_settings)
    client_auth: ClientAuth | None = None  # serve only; ``--client-ca`` overrides it
    # Where workloads keep their pod templates: the built-in table and the kinds users add.
    workloads: WorkloadTable = BUILT_IN

    def policy(self, name: str) -> Any:
        """The settings of the policy called ``name`` (its config key)."""
        return self.settings[_POSITION[name]]

    def mode(self, policy: str) -> Mode:
        return self.policy(policy).mode

    def active(self, policy: str, namespace: str, user: str = "", groups: tuple[str, ...] = ()) -> Mode:
        """``policy``'s mode for a request in ``namespace`` by ``user``: ``off`` where the
        namespace is excluded or an exemption lifts it. The one place this is decided."""
        if namespace in self.excluded_namespaces or self.exempts(policy, namespace, user, groups):
            return Mode.OFF
        return self.policy(policy).mode

    def exempts(self, policy: str, namespace: str, user: str, groups: tuple[str, ...]) -> bool:
        """Whether an exemption lifts ``policy`` for this namespace and requester."""
        if not self.exemptions:  # most configs: no generator built, for each policy of each review
            return False
        return any(e.covers(policy, namespace, user, groups) for e in self.exemptions)

    def kubelet_for(self, node: Node) -> KubeletConfig:
        """What the config says of ``node``'s kubelet (``policies.nodeAdmission``: its unsafe
        sysctls, its topology manager), for the faces that ask the kubelet's checks directly."""
        return self.node_admission.kubelet_for(node)

    @property
    def reservations(self) -> ReservationsConfig:
        """The coordination's settings (``policies.nodeAdmission.reservations``): the guards'
        table, Leases, deadlines and budget."""
        return self.node_admission.reservations

    @property
    def topology(self) -> TopologyConfig:
        """The topology manager check's settings (``policies.nodeAdmission.topology``)."""
        return self.node_admission.topology

    @property
    def device_resources(self) -> tuple[str, ...]:
        """The resource names that are devices (``policies.deviceScheduler.resources``)."""
        return self.device_scheduler.resources

    @property
    def pinned_node_name(self) -> PinnedNodeNameConfig:
        return self.policy("pinnedNodeName")

    @property
    def device_scheduler(self) -> DeviceSchedulerConfig:
        return self.policy("deviceScheduler")

    @property
    def node_admission(self) -> NodeAdmissionConfig:
        return self.policy("nodeAdmission")

    @property
    def storm_breaker(self) -> StormBreakerConfig:
        return self.policy("stormBreaker")


def load_config(path: str | Path) -> Config:
    """Read and validate a config file."""
    data = load_yaml(path, ConfigError)
    return config_from_dict(data if data is not None else {}, str(path))


def config_from_dict(data: Any, source: str = "config") -> Config:
    """Validate a decoded config document; unknown keys are errors (they are usually typos)."""
    reader = Reader(source)
    config = read_config(reader, data)
    reader.finish(ConfigError)
    return config


# Every key the file may hold, with what it is for: the reader accepts these and no others, and
# the generated reference (docs/reference/config.md) lists them.
TOP_LEVEL_KEYS = {
    "excludedNamespaces": "namespaces never touched, by any policy (default `[kube-system]`)",
    "failOpen": "server: objects the guard cannot parse are allowed with a warning (`true`, the "
    "default) or denied",
    "exemptions": "lift policies for requests that match every field given",
    "policies": "each policy's settings, under its name",
    "clientAuth": "serve: answer only callers with a certificate this CA signed (off when absent)",
    "workloads": "custom resources whose controllers create pods, added to the workload table",
}
EXEMPTION_KEYS = {
    "namespaces": "namespace globs",
    "users": "user globs (`userInfo.username`)",
    "groups": "group globs",
    "policies": "the policies it lifts (all when empty)",
}
CLIENT_AUTH_KEYS = {
    "ca": "the CA file that signs the API server's client certificate",
    "commonNames": "the certificate names answered (the subject's last common name); any when empty",
}
WORKLOAD_KEYS = {
    "apiVersion": "the custom resource's group and version",
    "kind": "its kind",
    "templates": "paths to its pod templates (`name[*]`: every item of a list, `*`: every value of a map)",
    "schedulerName": "optional: the field whose value its pods get when their template names none",
}


def read_config(reader: Reader, data: Any) -> Config:
    """The config in ``data``, its problems recorded in ``reader`` (a policy test file reads
    its configs into its own reader, so every problem of the file is listed at once)."""
    top = reader.mapping(data, "", set(TOP_LEVEL_KEYS))
    policies = reader.mapping(top.get("policies") or {}, "policies", set(NAMES))
    return Config(
        excluded_namespaces=reader.strings(
            top.get("excludedNamespaces", ["kube-system"]), "excludedNamespaces"
        ),
        fail_open=reader.boolean(top.get("failOpen", True), "failOpen", True),
        exemptions=tuple(
            _exemption(reader, item, f"exemptions[{i}]")
            for i, item in enumerate(reader.sequence(top.get("exemptions") or [], "exemptions"))
        ),
        settings=tuple(
            policy.read_settings(reader, _policy(reader, policies, policy.NAME), f"policies.{policy.NAME}")
            for policy in POLICIES
        ),
        client_auth=_client_auth(reader, top.get("clientAuth")),
        workloads=_workloads(reader, top.get("workloads") or [], "workloads"),
    )


def _policy(reader: Reader, policies: Mapping[str, Any], name: str) -> Mapping[str, Any]:
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


def _client_auth(reader: Reader, data: Any) -> ClientAuth | None:
    if data is None:
        return None
    item = reader.mapping(data, "clientAuth", set(CLIENT_AUTH_KEYS))
    ca = item.get("ca")
    if not isinstance(ca, str) or not ca:
        reader.fail(
            "clientAuth.ca", "must be the path of the CA file that signs the API server's client certificate"
        )
        ca = ""
    return ClientAuth(ca, reader.strings(item.get("commonNames") or [], "clientAuth.commonNames"))


def _exemption(reader: Reader, data: Any, where: str) -> Exemption:
    item = reader.mapping(data, where, set(EXEMPTION_KEYS))
    policies = reader.strings(item.get("policies", []), f"{where}.policies")
    for name in policies:
        if name not in NAMES:
            reader.fail(f"{where}.policies", f"unknown policy {name!r} (one of {', '.join(NAMES)})")
    exemption = Exemption(
        namespaces=reader.strings(item.get("namespaces", []), f"{where}.namespaces"),
        users=reader.strings(item.get("users", []), f"{where}.users"),
        groups=reader.strings(item.get("groups", []), f"{where}.groups"),
        policies=policies,
    )
    if not (exemption.namespaces or exemption.users or exemption.groups):
        reader.fail(where, "needs at least one of namespaces, users, groups")
    return exemption


def _workloads(reader: Reader, data: Any, where: str) -> WorkloadTable:
    """``workloads:``, custom resources whose controllers create pods from templates inside
    them, added to the built-in table (an entry for a built-in custom resource replaces it)."""
    added: list[WorkloadKind] = []
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(reader.sequence(data, where)):
        at = f"{where}[{i}]"
        item = reader.mapping(raw, at, set(WORKLOAD_KEYS))
        if not item:
            continue
        kind = _workload_kind(reader, item, at)
        if kind is None:
            continue
        key = (kind.group, kind.kind)
        if key in seen:
            reader.fail(f"{at}.kind", f"{kind.kind} of {kind.group} is listed twice")
        seen.add(key)
        added.append(kind)
    return WorkloadTable.of((*BUILT_IN.kinds, *added)) if added else BUILT_IN


def _workload_kind(reader: Reader, item: Mapping[str, Any], at: str) -> WorkloadKind | None:
    api_version, kind = item.get("apiVersion"), item.get("kind")
    ok = True
    if not isinstance(api_version, str) or api_version.count("/") != 1 or not all(api_version.split("/")):
        reader.fail(f"{at}.apiVersion", "must be group/version of a custom resource, like example.com/v1")
        ok = False
    if not isinstance(kind, str) or not kind:
        reader.fail(f"{at}.kind", "must be the kind's name, like Trainer")
        ok = False
    elif isinstance(api_version, str) and is_built_in(api_version.rsplit("/", 1)[0], kind):
        reader.fail(f"{at}.kind", f"{kind} of {api_version} is built in and cannot be redefined")
        ok = False
    templates = reader.strings(item.get("templates"), f"{at}.templates")
    if item.get("templates") == []:
        reader.fail(f"{at}.templates", "must list at least one path, like spec.roles[*].template")
    paths = [_field_path(reader, text, f"{at}.templates[{j}]") for j, text in enumerate(templates)]
    scheduler = item.get("schedulerName")
    if scheduler is not None and not isinstance(scheduler, str):
        reader.fail(f"{at}.schedulerName", "must be a path like spec.schedulerName")
    elif scheduler is not None and _field_path(reader, scheduler, f"{at}.schedulerName") is None:
        ok = False
    if not ok or not templates or None in paths:
        return None
    return WorkloadKind.of(api_version, kind, templates, scheduler or None, source="config")


def _field_path(reader: Reader, text: str, where: str) -> FieldPath | None:
    try:
        return FieldPath.parse(text)
    except ValueError as err:
        reader.fail(where, str(err))
        return None
