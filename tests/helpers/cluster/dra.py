"""A DRA driver's kubelet plugin, one per node: ``NodePrepareResources`` for a claim's devices
on this node. A device already prepared for another claim cannot be handed out again: the
prepare fails (the pod stays Pending, ``FailedPrepareDynamicResources``), as a GPU driver
refuses a GPU it has already given a container (``k8s.io/dynamic-resource-allocation/
kubeletplugin`` calls the driver's ``PrepareResourceClaims``; the example driver of
``kubernetes-sigs/dra-example-driver`` keeps the prepared devices per claim the same way).
"""

from __future__ import annotations

import threading
from typing import Any


class PrepareError(Exception):
    pass


class DraDriver:
    def __init__(self, driver: str, pool: str) -> None:
        self.driver, self.pool = driver, pool
        self.prepared: dict[str, str] = {}  # device → claim uid
        self.failures = 0
        self._lock = threading.Lock()

    def prepare(self, claim: dict[str, Any]) -> list[str]:
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            raise PrepareError(f"claim {claim['metadata']['name']} is not allocated")
        uid = claim["metadata"]["uid"]
        mine = [r["device"] for r in allocation["devices"]["results"]
                if r["driver"] == self.driver and r["pool"] == self.pool]  # fmt: skip
        with self._lock:
            for device in mine:
                holder = self.prepared.get(device)
                if holder is not None and holder != uid:
                    self.failures += 1
                    raise PrepareError(f"device {device} is already prepared for claim {holder}")
            for device in mine:
                self.prepared[device] = uid
        return mine
