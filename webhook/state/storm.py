"""Per-owner records of pods the kubelet rejected at admission, and a breaker per owner.

Every worker's informer sees the same Failed pods, so every worker's breakers reach the same
state without talking to each other. A rejection's time is when the guard first saw the pod
Failed (a watch event), or the pod's ``creationTimestamp`` when it was found by a list or in a
snapshot. Memory is bounded by owners x window: an owner keeps at most ``MAX_KEPT`` recent
rejections (and the keys of ``MAX_SEEN`` pods, so a relist does not count a pod twice), closed
owners with nothing in the window are forgotten, and so are open ones with nothing new (no
rejection, no probe) for a cool-down and a window: their controller stopped creating pods.
A list that finds old Failed pods records them but trips nothing: only rejections within the
window of now can open a breaker, and only one newer than the last known can reopen it.

Breaker per owner (the controller ``ownerReference``):
closed → open when ``threshold`` rejections fall within ``window``; open denies the owner's pod
CREATEs; ``cooldown`` after the last rejection it admits one probe (half-open) and still denies
the others; the probe rejected → open again with the cool-down doubled (at most an hour); a
pod of the owner seen Running while half-open → closed.

Agreement. Rejections reach every worker alike, but a probe is admitted by one worker, and only
it would know to double the cool-down when the probe is rejected, or to close on a Running pod.
So the probe slot is shared (``coordination.probes.SharedProbes``): a worker whose breaker would
admit a probe first claims the slot in the replica's table and, across replicas, in a Lease per
open breaker (etcd is the arbiter), adopting what the others did (``adopt``): a probe out,
rejected, or run. Exactly one probe passes per half-open period, cluster-wide, and every
worker's cool-down is the same.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..kube.rejection import Owner, admission_rejection, controller_owner
from ..kube.timestamps import object_time

log = logging.getLogger(__name__)
_replayed = logging.getLogger(__name__ + ".replayed")  # what a snapshot's replay logs: nothing
_replayed.propagate = False
_replayed.addHandler(logging.NullHandler())

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"
MAX_COOLDOWN = 3600.0
MAX_KEPT = 1024  # recent rejections kept per owner, whatever the storm's size
MAX_SEEN = 4 * MAX_KEPT  # pod keys remembered per owner, so a relist never counts a pod twice


@dataclass(slots=True)
class Breaker:
    owner: Owner
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_KEPT))
    seen: dict[str, None] = field(default_factory=dict)  # pods counted, oldest first
    reasons: Counter[str] = field(default_factory=Counter)
    nodes: Counter[str] = field(default_factory=Counter)
    total: int = 0
    state: str = CLOSED
    last_rejection: float = 0.0
    cooldown: float = 0.0
    probe_at: float | None = None
    opened_at: float = 0.0  # when it last left closed: probes older than that were another storm's
    running_at: float = 0.0  # the last pod of the owner seen Running

    def in_window(self, now: float, window: float) -> int:
        return sum(1 for at in self.recent if at > now - window)

    def quiet_since(self) -> float:
        """The last thing that happened to it: a rejection, or a probe admitted."""
        return max(self.last_rejection, self.probe_at or 0.0)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the breaker says about one more pod of its owner, at a given time."""

    deny: bool
    probe: bool  # allowed as the half-open probe
    breaker: Breaker | None


_ALLOW = Verdict(False, False, None)


class StormBreakers:
    """The breakers of every owner whose pods the kubelet rejected; thread-safe."""

    def __init__(
        self, threshold: int = 20, window: float = 300.0, cooldown: float = 120.0, *, quiet: bool = False
    ) -> None:
        self.threshold, self.window, self.base_cooldown = threshold, window, cooldown
        # A snapshot's breakers are rebuilt, not tripped now: their transitions are history,
        # not events to log (a dry run says its verdict, not a replay on stderr).
        self._log = _replayed if quiet else log
        self.breakers: dict[str, Breaker] = {}
        self.trips = 0
        self.probes = 0
        self._lock = threading.Lock()

    @property
    def lock(self) -> threading.Lock:
        """What every change to the breakers is made under (a fork must not split one)."""
        return self._lock

    @classmethod
    def from_config(cls, config, *, quiet: bool = False) -> StormBreakers:
        return cls(config.threshold, config.window_seconds, config.cooldown_seconds, quiet=quiet)

    # -- what the informer and the snapshot loader report --------------------------------

    def observe(
        self,
        pod: Mapping[str, Any],
        seen_at: float | None,
        now: float | None = None,
        *,
        as_of: float | None = None,
    ) -> None:
        """A pod from a watch event (``seen_at``: now) or a list/snapshot (None: its
        ``creationTimestamp``). Only Failed-at-admission and Running pods of an owner matter.
        ``now``: when a live list runs, so old rejections it finds trip nothing (a snapshot
        passes None: its breakers are rebuilt as they stood when it was taken). ``as_of``: a
        snapshot judged at an earlier time (``--now``); a pod created after it had not been
        rejected, or run, yet."""
        if as_of is not None and (_created(pod) or 0.0) > as_of:
            return
        status = pod.get("status")
        phase = status.get("phase") if isinstance(status, Mapping) else None
        if phase == "Running":
            if self.breakers:
                owner = controller_owner(pod)
                if owner is not None and owner.uid in self.breakers:
                    self.running(owner.uid, seen_at if seen_at is not None else _created(pod) or 0.0)
            return
        if phase != "Failed":
            return
        rejection = admission_rejection(pod)
        owner = controller_owner(pod) if rejection is not None else None
        if owner is None:
            return
        at = seen_at if seen_at is not None else _created(pod)
        if at is None:
            return
        metadata = pod.get("metadata") or {}
        spec = pod.get("spec")
        node = spec.get("nodeName") if isinstance(spec, Mapping) else ""
        key = str(metadata.get("uid") or f"{owner.namespace}/{metadata.get('name')}")
        self.rejected(owner, key, rejection.reason, str(node or ""), at, now)

    def rejected(
        self, owner: Owner, pod: str, reason: str, node: str, at: float, now: float | None = None
    ) -> None:
        """Record one rejection at ``at``; ``now`` (a live list's time) keeps old ones from tripping."""
        with self._lock:
            breaker = self.breakers.get(owner.uid)
            if breaker is None:
                breaker = self.breakers[owner.uid] = Breaker(owner)
            if pod in breaker.seen:
                return  # the same Failed pod, modified again or listed again
            breaker.seen[pod] = None
            if len(breaker.seen) > MAX_SEEN:
                del breaker.seen[next(iter(breaker.seen))]
            newer = at > breaker.last_rejection
            breaker.recent.append(at)
            breaker.reasons[reason] += 1
            breaker.nodes[node or "<no node>"] += 1
            breaker.total += 1
            breaker.last_rejection = max(breaker.last_rejection, at)
            if now is not None and at <= now - self.window:
                return  # found by a list, long over: it counts, but opens nothing
            if breaker.state == HALF_OPEN and newer:
                self._open(breaker, min(2 * breaker.cooldown, MAX_COOLDOWN), "the probe was rejected")
            elif breaker.state == CLOSED and breaker.in_window(at, self.window) >= self.threshold:
                self.trips += 1
                self._open(breaker, self.base_cooldown, f"{self.threshold} rejections within the window")

    def running(self, owner_uid: str, at: float) -> None:
        """A pod of the owner is Running: a half-open breaker closes."""
        with self._lock:
            breaker = self.breakers.get(owner_uid)
            if breaker is None:
                return
            breaker.running_at = max(breaker.running_at, at)
            if breaker.state == HALF_OPEN and at >= (breaker.probe_at or 0.0):
                self._close(breaker)

    # -- what a review asks, and what the server reports back ----------------------------

    def verdict(self, owner_uid: str, now: float) -> Verdict:
        """Pure read: deny, admit as the probe, or admit."""
        breaker = self.breakers.get(owner_uid)
        if breaker is None or breaker.state == CLOSED:
            return _ALLOW
        if breaker.state == OPEN:
            if now - breaker.last_rejection >= breaker.cooldown:
                return Verdict(False, True, breaker)
            return Verdict(True, False, breaker)
        # Half-open: one probe at a time; a probe that never showed up is replaced after a cool-down.
        if breaker.probe_at is not None and now - breaker.probe_at < breaker.cooldown:
            return Verdict(True, False, breaker)
        return Verdict(False, True, breaker)

    def probe_admitted(self, owner_uid: str, now: float) -> None:
        with self._lock:
            breaker = self.breakers.get(owner_uid)
            if breaker is None or breaker.state == CLOSED:
                return
            breaker.state, breaker.probe_at = HALF_OPEN, now
            self.probes += 1
            self._log.info("storm breaker half-open for %s: one probe pod admitted", _describe(breaker.owner))

    def next_probe(self, owner_uid: str, now: float) -> ProbeSlot | None:
        """The slot a probe admitted now would take, or None when no probe may pass now."""
        breaker = self.breakers.get(owner_uid)
        if breaker is None or not self.verdict(owner_uid, now).probe:
            return None
        return ProbeSlot(now, breaker.cooldown)

    def adopt(self, owner_uid: str, slot: ProbeSlot | None) -> None:
        """What another worker or replica did with this storm's probe: admitted it (half-open,
        with its cool-down), saw it rejected (open, the cool-down doubled), or saw a pod of the
        owner Running since (closed). A slot from before this storm opened is another storm's."""
        with self._lock:
            breaker = self.breakers.get(owner_uid)
            if slot is None or breaker is None or breaker.state == CLOSED or slot.at < breaker.opened_at:
                return
            if breaker.state == HALF_OPEN and (breaker.probe_at or 0.0) >= slot.at:
                return  # this worker's own probe, or a later one
            if breaker.last_rejection > slot.at:  # the probe was rejected
                doubled = min(2 * slot.cooldown, MAX_COOLDOWN)
                if breaker.state == HALF_OPEN or breaker.cooldown < doubled:
                    self._open(breaker, doubled, "the probe was rejected")
            elif breaker.running_at >= slot.at:
                self._close(breaker)
            else:
                breaker.state, breaker.probe_at, breaker.cooldown = HALF_OPEN, slot.at, slot.cooldown

    def open_breakers(self) -> list[Breaker]:
        with self._lock:
            return [b for b in self.breakers.values() if b.state != CLOSED]

    def prune(self, now: float) -> None:
        """Forget closed owners with nothing in the window (memory: owners x window), and open
        ones quiet for a cool-down and a window: no pod of theirs came to be probed."""
        with self._lock:
            for uid in [uid for uid, b in self.breakers.items() if self._forgotten(b, now)]:
                if self.breakers[uid].state != CLOSED:
                    self._log.info(
                        "storm breaker forgotten for %s: no pod came for a probe",
                        _describe(self.breakers[uid].owner),
                    )
                del self.breakers[uid]

    def _forgotten(self, breaker: Breaker, now: float) -> bool:
        if breaker.state == CLOSED:
            return breaker.last_rejection <= now - self.window
        return breaker.quiet_since() <= now - breaker.cooldown - self.window

    def _open(self, breaker: Breaker, cooldown: float, why: str) -> None:
        if breaker.state == CLOSED:
            breaker.opened_at = breaker.last_rejection
        breaker.state, breaker.cooldown, breaker.probe_at = OPEN, cooldown, None
        self._log.warning(
            "storm breaker open for %s: %s; cool-down %.0f s", _describe(breaker.owner), why, cooldown
        )

    def _close(self, breaker: Breaker) -> None:
        breaker.state, breaker.probe_at = CLOSED, None
        breaker.recent.clear()  # the pods stay seen: listed again, they count no more
        self._log.info("storm breaker closed for %s: a pod is Running", _describe(breaker.owner))


@dataclass(frozen=True, slots=True)
class ProbeSlot:
    """A probe admitted somewhere: when, and the cool-down then in force."""

    at: float
    cooldown: float


def _describe(owner: Owner) -> str:
    return f"{owner.kind} {owner.namespace}/{owner.name}"


def _created(pod: Mapping[str, Any]) -> float | None:
    metadata = pod.get("metadata")
    return object_time(metadata.get("creationTimestamp")) if isinstance(metadata, Mapping) else None
