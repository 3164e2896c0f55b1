"""A client's informer cache: the store's watch events applied ``lag`` seconds after they
happened, so each scheduler (and each kubelet) decides from a view as stale as a loaded API
server and a busy informer make it.

It reads the fake server's event log directly rather than over HTTP: the lag is the point,
not the wire, and the guard's informer already exercises the wire.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from tests.helpers.fake_apiserver import Cluster


class Cache:
    """``objects[resource][uid or name]``: what this client believes, as of ``lag`` ago."""

    def __init__(self, cluster: Cluster, resources: tuple[str, ...], lag: float) -> None:
        self.cluster, self.resources, self.lag = cluster, resources, lag
        with cluster.changed:
            self.objects: dict[str, dict[str, dict[str, Any]]] = {
                r: {k: orjson.loads(v) for k, v in cluster.objects[r].items()} for r in resources
            }
            self._position = {r: len(cluster.log[r]) for r in resources}

    def sync(self) -> bool:
        """Apply the events now due; whether anything changed."""
        ready = time.monotonic() - self.lag
        changed = False
        with self.cluster.changed:
            for resource in self.resources:
                log, position = self.cluster.log[resource], self._position[resource]
                while position < len(log):
                    rv, line = log[position]
                    if self.cluster.recorded.get(rv, 0.0) > ready:
                        break
                    event = orjson.loads(line)
                    obj = event["object"]
                    key = obj["metadata"].get("uid") or obj["metadata"]["name"]
                    if event["type"] == "DELETED":
                        self.objects[resource].pop(key, None)
                    else:
                        self.objects[resource][key] = obj
                    position += 1
                    changed = True
                self._position[resource] = position
        return changed

    def list(self, resource: str) -> list[dict[str, Any]]:
        return list(self.objects[resource].values())
