"""A small Kubernetes API server on loopback: paginated lists and chunked watch streams for
nodes and pods, driven by a scripted event log, with faults injected on demand.

It speaks just enough of the real protocol for the informer: ``limit``/``continue``
pagination over a consistent snapshot, ``watch=true&resourceVersion=N`` replaying every event
after N then following new ones, bookmarks, ``410`` once the log is compacted past N, and a
bearer token. Faults are queued per resource and consumed by the next request; two switches
misbehave for as long as they are set: ``gone_watches`` (every watch answers 410) and
``ignore_limit`` (every list comes whole, in one response).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import orjson

PATHS = {
    "/api/v1/nodes": "nodes",
    "/api/v1/pods": "pods",
    "/apis/resource.k8s.io/v1/resourceslices": "resourceslices",
    "/apis/resource.k8s.io/v1/resourceclaims": "resourceclaims",
    "/apis/resource.k8s.io/v1/deviceclasses": "deviceclasses",
    "/apis/resource.k8s.io/v1alpha3/devicetaintrules": "devicetaintrules",
    "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies": "noderesourcetopologies",
}
DRA = ("resourceslices", "resourceclaims", "deviceclasses")
TAINT_RULES = "devicetaintrules"  # alpha in 1.35 (DRADeviceTaints): a cluster may not serve it
TOPOLOGIES = "noderesourcetopologies"  # a CRD, there only where an NRT exporter is installed
DISCOVERY = "/apis/resource.k8s.io/v1"
LEASES = re.compile(
    r"/apis/coordination\.k8s\.io/v1/namespaces/(?P<namespace>[^/]+)/leases(?:/(?P<name>[^/]+))?"
)
LIST_KINDS = {
    "nodes": "NodeList",
    "pods": "PodList",
    "resourceslices": "ResourceSliceList",
    "resourceclaims": "ResourceClaimList",
    "deviceclasses": "DeviceClassList",
    "devicetaintrules": "DeviceTaintRuleList",
    "noderesourcetopologies": "NodeResourceTopologyList",
}
# apimachinery's ``TotalAnnotationSizeLimitB``: the bytes of an object's annotations, keys included.
ANNOTATIONS_LIMIT = 256 * 1024
# Discovery (``/apis``, ``/apis/GROUP/VERSION``): group → (its preferred groupVersion, its
# resources as (plural, kind)). Empty: the cluster serves no API group beyond these lists.
API_GROUPS: dict[str, tuple[str, list[tuple[str, str]]]] = {}


@dataclass
class Fault:
    """One injected fault. ``after`` events are sent first (watch faults)."""

    kind: str  # drop | malformed | stall | slow | oversized | gone | http500 | expire-continue
    after: int = 0
    seconds: float = 0.0
    size: int = 0  # oversized: the bytes of the event line sent in place of the next one


@dataclass
class Cluster:
    """The truth: current objects, the event log, and the faults still to inject."""

    token: str = "test-token"
    bookmark_every: float = 0.5
    rv: int = 100
    objects: dict[str, dict[str, bytes]] = field(default_factory=lambda: {r: {} for r in LIST_KINDS})
    log: dict[str, list[tuple[int, bytes]]] = field(default_factory=lambda: {r: [] for r in LIST_KINDS})
    floor: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LIST_KINDS, 0))
    faults: dict[str, list[Fault]] = field(default_factory=lambda: {r: [] for r in LIST_KINDS})
    serves_dra: bool = False  # resource.k8s.io/v1: discovery and its lists answer 404 when off
    serves_taint_rules: bool = False  # resource.k8s.io/v1alpha3 devicetaintrules: 404 when off
    serves_topologies: bool = False  # topology.node.k8s.io/v1alpha2 noderesourcetopologies: 404 when off
    snapshots: dict[str, tuple[int, list[bytes]]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    frozen: dict[str, tuple[int, list[bytes]]] = field(default_factory=dict)
    watch_generation: int = 0
    # coordination.k8s.io Leases, namespaced, with resourceVersion conflicts (409) like etcd's.
    leases: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    lease_writes: int = 0
    lease_conflicts: int = 0
    lease_deletes: int = 0
    lease_delay: float = 0.0  # seconds before each Lease answer: a slow API server
    list_delay: float = 0.0  # seconds before each list's first page: a large or loaded cluster
    # Seconds each watch event waits before it is sent: a loaded API server's watch cache, so a
    # review can carry a resourceVersion newer than any watcher has seen.
    watch_lag: float = 0.0
    gone_watches: str = ""  # "event": every watch is an in-stream 410 ERROR; "status": HTTP 410
    ignore_limit: bool = False  # lists come whole, streamed item by item, whatever their limit
    lists: collections.Counter = field(default_factory=collections.Counter)  # full lists per resource

    def __post_init__(self) -> None:
        self.changed = threading.Condition()
        self.lease_lock = threading.Lock()
        self.recorded: dict[int, float] = {}  # event resourceVersion → when it happened (monotonic)

    # -- the script -------------------------------------------------------------------

    def put(self, resource: str, obj: dict[str, Any]) -> None:
        """Create or update an object (ADDED or MODIFIED, like the real server)."""
        with self.changed:
            key = _key(obj)
            kind = "MODIFIED" if key in self.objects[resource] else "ADDED"
            self._record(resource, kind, key, obj)

    def delete(self, resource: str, key: str) -> None:
        with self.changed:
            obj = orjson.loads(self.objects[resource][key])
            self._record(resource, "DELETED", key, obj)

    def load(self, resource: str, objects: Iterable[dict[str, Any]]) -> None:
        """Bulk-create objects with no watch events (the state before anyone watched)."""
        with self.changed:
            for obj in objects:
                self.rv += 1
                obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
                self.objects[resource][_key(obj)] = orjson.dumps(obj)
            self.floor[resource] = self.rv

    def end_watches(self) -> None:
        """End every open watch as a server-side timeout would; the next watch meets the faults."""
        with self.changed:
            self.watch_generation += 1
            self.changed.notify_all()

    def compact(self, resource: str) -> None:
        """Forget the log: watches from an older resourceVersion now get 410 Gone."""
        with self.changed:
            self.floor[resource] = self.rv
            self.log[resource].clear()

    def freeze_lists(self) -> None:
        """Serve lists as of now from here on, so events recorded later reach only watches."""
        with self.changed:
            self.frozen = {r: (self.rv, list(objs.values())) for r, objs in self.objects.items()}

    def inject(self, resource: str, *faults: Fault) -> None:
        with self.changed:
            self.faults[resource].extend(faults)

    def truth(self, resource: str) -> list[dict[str, Any]]:
        with self.changed:
            return [orjson.loads(raw) for raw in self.objects[resource].values()]

    def _record(self, resource: str, kind: str, key: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj = {**obj, "metadata": {**obj.get("metadata", {}), "resourceVersion": str(self.rv)}}
        raw = orjson.dumps(obj)
        if kind == "DELETED":
            del self.objects[resource][key]
        else:
            self.objects[resource][key] = raw
        self.log[resource].append((self.rv, b'{"type":"%s","object":%s}\n' % (kind.encode(), raw)))
        self.recorded[self.rv] = time.monotonic()
        self.changed.notify_all()

    def due(self, resource: str, since: int) -> list[tuple[int, bytes]]:
        """The events after ``since`` that a watch may send now: in order, each ``watch_lag``
        seconds after it happened (called holding ``changed``)."""
        events = [(rv, line) for rv, line in self.log[resource] if rv > since]
        if not self.watch_lag:
            return events
        ready = time.monotonic() - self.watch_lag
        due = list(itertools.takewhile(lambda e: self.recorded.get(e[0], 0.0) <= ready, events))
        if len(due) < len(events):  # wake up when the next one is due
            threading.Timer(self.watch_lag / 4, self._notify).start()
        return due

    def _notify(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def _fault(self, resource: str, kinds: tuple[str, ...]) -> Fault | None:
        with self.changed:
            for i, fault in enumerate(self.faults[resource]):
                if fault.kind in kinds:
                    return self.faults[resource].pop(i)
        return None


def _key(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    return metadata.get("uid") or metadata["name"]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle on, the body waits for the client's
    # delayed ACK (40 ms a response). Go's API server sets TCP_NODELAY too.
    disable_nagle_algorithm = True
    cluster: Cluster

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        try:
            if LEASES.match(urlparse(self.path).path):
                return self._lease("GET")
            self._get()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away: that is its right

    def do_PUT(self) -> None:
        self._lease("PUT")

    def do_POST(self) -> None:
        self._lease("POST")

    def do_DELETE(self) -> None:
        self._lease("DELETE")

    def _lease(self, method: str) -> None:
        """GET/PUT/DELETE one Lease, POST (create) one, or GET the namespace's list: optimistic
        concurrency on resourceVersion (a PUT or a DELETE with a stale one is a 409), and the
        API server's limit on annotations (``ValidateAnnotationsSize``: 422 past 256 KiB)."""
        match = LEASES.match(urlparse(self.path).path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method != "GET" else b""
        if self.headers.get("Authorization") != f"Bearer {self.cluster.token}":
            return self._status(401, "Unauthorized", "invalid bearer token")
        if match is None:
            return self._status(404, "NotFound", f"{self.path} not found")
        cluster, namespace = self.cluster, match["namespace"]
        time.sleep(cluster.lease_delay)
        with cluster.lease_lock:
            if method == "GET" and not match["name"]:
                items = [lease for (ns, _), lease in sorted(cluster.leases.items()) if ns == namespace]
                listing = {
                    "kind": "LeaseList",
                    "metadata": {"resourceVersion": str(cluster.rv)},
                    "items": items,
                }
                return self._send(200, orjson.dumps(listing))
            if method in ("GET", "DELETE"):
                lease = cluster.leases.get((namespace, match["name"] or ""))
                if lease is None:
                    return self._status(404, "NotFound", "lease not found")
                if method == "GET":
                    return self._send(200, orjson.dumps(lease))
                wanted = ((orjson.loads(body) if body else {}).get("preconditions") or {}).get(
                    "resourceVersion"
                )
                if wanted is not None and wanted != lease["metadata"]["resourceVersion"]:
                    cluster.lease_conflicts += 1
                    return self._status(409, "Conflict", "the object has been modified (precondition)")
                del cluster.leases[(namespace, match["name"])]
                cluster.lease_deletes += 1
                return self._send(200, orjson.dumps({"kind": "Status", "status": "Success"}))
            obj = orjson.loads(body)
            name = obj.get("metadata", {}).get("name", "")
            current = cluster.leases.get((namespace, name))
            if method == "POST" and current is not None:
                cluster.lease_conflicts += 1
                return self._status(409, "AlreadyExists", f"leases {name} already exists")
            if method == "PUT" and (
                current is None
                or obj["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]
            ):
                cluster.lease_conflicts += 1
                return self._status(
                    409, "Conflict", "the object has been modified; please apply your changes"
                )
            annotations = obj["metadata"].get("annotations") or {}
            if sum(len(k) + len(v) for k, v in annotations.items()) > ANNOTATIONS_LIMIT:
                return self._status(
                    422,
                    "Invalid",
                    f"metadata.annotations: Too long: must have at most {ANNOTATIONS_LIMIT} bytes",
                )
            cluster.rv += 1
            obj["metadata"].update(namespace=namespace, resourceVersion=str(cluster.rv))
            cluster.leases[(namespace, name)] = obj
            cluster.lease_writes += 1
            return self._send(201 if method == "POST" else 200, orjson.dumps(obj))

    def _get(self) -> None:
        url = urlparse(self.path)
        if url.path == DISCOVERY and self.cluster.serves_dra:
            return self._send(
                200, orjson.dumps({"kind": "APIResourceList", "groupVersion": "resource.k8s.io/v1"})
            )
        if url.path == "/apis" or (url.path.startswith("/apis/") and url.path.count("/") == 3):
            return self._discovery(url.path)
        resource = asked = PATHS.get(url.path)
        if resource in DRA and not self.cluster.serves_dra:
            resource = None
        if resource == TAINT_RULES and not self.cluster.serves_taint_rules:
            resource = None
        if resource == TOPOLOGIES and not self.cluster.serves_topologies:
            resource = None
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        # What was asked for, served or not (an unserved one is answered 404 below).
        self.cluster.requests.append(f"{asked} {'watch' if query.get('watch') else 'list'}")
        if self.headers.get("Authorization") != f"Bearer {self.cluster.token}":
            return self._status(401, "Unauthorized", "invalid bearer token")
        if resource is None:
            return self._status(404, "NotFound", f"{url.path} not found")
        if self.cluster._fault(resource, ("http500",)):
            return self._status(500, "InternalError", "injected failure")
        if query.get("watch") == "true":
            if self.cluster.gone_watches == "status":
                return self._status(410, "Expired", "too old resource version")
            return self._watch(
                resource, int(query.get("resourceVersion") or 0), int(query.get("timeoutSeconds", 60))
            )
        if not query.get("continue"):
            self.cluster.lists[resource] += 1
            time.sleep(self.cluster.list_delay)
        if self.cluster.ignore_limit:
            return self._whole_list(resource)
        return self._list(resource, int(query.get("limit") or 0), query.get("continue", ""))

    def _discovery(self, path: str) -> None:
        if self.headers.get("Authorization") != f"Bearer {self.cluster.token}":
            return self._status(401, "Unauthorized", "invalid bearer token")
        if path == "/apis":
            groups = [
                {"name": name, "versions": [{"groupVersion": gv}], "preferredVersion": {"groupVersion": gv}}
                for name, (gv, _) in API_GROUPS.items()
            ]
            return self._send(
                200, orjson.dumps({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
            )
        served = {gv: resources for gv, resources in API_GROUPS.values()}
        group_version = path.removeprefix("/apis/")
        if group_version not in served:
            return self._status(404, "NotFound", f"{path} not found")
        resources = [
            {"name": plural, "kind": kind, "namespaced": True, "verbs": ["get", "list", "watch"]}
            for plural, kind in served[group_version]
        ]
        body = {"kind": "APIResourceList", "groupVersion": group_version, "resources": resources}
        return self._send(200, orjson.dumps(body))

    def _list(self, resource: str, limit: int, token: str) -> None:
        cluster = self.cluster
        if token:
            if token not in cluster.snapshots or cluster._fault(resource, ("expire-continue",)):
                return self._status(410, "Expired", "the provided continue parameter is too old")
            rv, items = cluster.snapshots[token]
            offset = int(token.rsplit(":", 1)[1])
        else:
            with cluster.changed:
                if resource in cluster.frozen:
                    (rv, items), offset = cluster.frozen[resource], 0
                else:
                    rv, items, offset = cluster.rv, list(cluster.objects[resource].values()), 0
        end = offset + limit if limit else len(items)
        metadata: dict[str, Any] = {"resourceVersion": str(rv)}
        if end < len(items):
            next_token = f"{resource}-{rv}-{id(items)}:{end}"
            cluster.snapshots[next_token] = (rv, items)
            metadata["continue"] = next_token
        body = b'{"kind":"%s","apiVersion":"v1","metadata":%s,"items":[%s]}' % (
            LIST_KINDS[resource].encode(),
            orjson.dumps(metadata),
            b",".join(items[offset:end]),
        )
        self._send(200, body)

    def _whole_list(self, resource: str) -> None:
        """Every object in one chunked response, a chunk per thousand items: the server holds no copy."""
        with self.cluster.changed:
            rv, items = self.cluster.rv, list(self.cluster.objects[resource].values())
        self._chunked_headers()
        head = b'{"kind":"%s","apiVersion":"v1","metadata":{"resourceVersion":"%d"},"items":[' % (
            LIST_KINDS[resource].encode(),
            rv,
        )
        self._chunk(head)
        for i in range(0, len(items), 1000):
            self._chunk((b"," if i else b"") + b",".join(items[i : i + 1000]))
        self._chunk(b"]}")
        self._chunk(b"")

    def _chunked_headers(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _watch(self, resource: str, since: int, timeout: int) -> None:
        cluster = self.cluster
        self._chunked_headers()
        gone = cluster.gone_watches == "event" or cluster._fault(resource, ("gone",))
        if since < cluster.floor[resource] or gone:
            status = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "Expired",
                "code": 410,
            }
            self._chunk(orjson.dumps({"type": "ERROR", "object": status}) + b"\n")
            return self._chunk(b"")
        fault = cluster._fault(resource, ("drop", "malformed", "stall", "slow", "oversized"))
        deadline = time.monotonic() + timeout
        sent, last_bookmark, generation = 0, time.monotonic(), cluster.watch_generation
        while time.monotonic() < deadline and generation == cluster.watch_generation:
            with cluster.changed:
                pending = cluster.due(resource, since)
                if not pending:
                    cluster.changed.wait(min(cluster.bookmark_every, max(0.0, deadline - time.monotonic())))
                    pending = cluster.due(resource, since)
                current = pending[-1][0] if cluster.watch_lag and pending else since
                if not cluster.watch_lag:
                    current = cluster.rv
            batch: list[bytes] = []
            for rv, line in pending:
                if fault is not None and sent >= fault.after:
                    self._chunks(batch)
                    batch = []
                    if fault.kind == "drop":
                        return self._abort()
                    if fault.kind == "malformed":
                        self._chunk(b'{"type":"MODIFIED","object":{"metadata":\n')
                        return self._chunk(b"")
                    if fault.kind == "stall":
                        time.sleep(fault.seconds)
                        return self._abort()
                    if fault.kind == "slow":
                        time.sleep(fault.seconds)
                    if fault.kind == "oversized":
                        self._oversized_event(fault.size)
                        fault = None  # once; the events after it follow as usual
                batch.append(line)
                sent += 1
                since = rv
            self._chunks(batch)
            if time.monotonic() - last_bookmark >= cluster.bookmark_every:
                bookmark = {
                    "type": "BOOKMARK",
                    "object": {"metadata": {"resourceVersion": str(max(since, current))}},
                }
                self._chunk(orjson.dumps(bookmark) + b"\n")
                since, last_bookmark = max(since, current), time.monotonic()
        self._chunk(b"")  # the server-side timeout: a normal end of the watch

    def _oversized_event(self, size: int) -> None:
        """One chunk holding one event line of ``size`` bytes, written a piece at a time (the
        server never holds it whole); a client that gives up on it closes the connection."""
        head = b'{"type":"MODIFIED","object":{"metadata":{"name":"huge"},"data":"'
        tail = b'"}}\n'
        self.wfile.write(b"%x\r\n" % size + head)
        filler, left = b"x" * 65536, size - len(head) - len(tail)
        while left > 0:
            self.wfile.write(filler[: min(left, len(filler))])
            left -= len(filler)
        self.wfile.write(tail + b"\r\n")
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        self._chunks([data])

    def _chunks(self, events: list[bytes]) -> None:
        """One HTTP chunk per event, as the API server writes them, in one write per batch."""
        if events:
            self.wfile.write(b"".join(b"%x\r\n%s\r\n" % (len(data), data) for data in events))
            self.wfile.flush()

    def _abort(self) -> None:
        self.close_connection = True
        self.connection.shutdown(2)

    def _status(self, code: int, reason: str, message: str) -> None:
        body = orjson.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
                             "message": message, "code": code})  # fmt: skip
        self._send(code, body)

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class FakeApiServer:
    """Serves ``cluster`` on a free loopback port until ``close``."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        handler = type("Handler", (_Handler,), {"cluster": cluster})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def kubeconfig(self, path) -> str:
        return write_kubeconfig(path, self.url, self.cluster.token)

    def close(self) -> None:
        with self.cluster.changed:
            self.cluster.changed.notify_all()
        self._server.shutdown()
        self._server.server_close()


def write_kubeconfig(path, url: str, token: str) -> str:
    """A kubeconfig for ``url`` with a bearer token; returns its path."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "guard", "user": {"token": token}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "guard"}}],
        "current-context": "fake",
    }
    path.write_bytes(orjson.dumps(config))
    return str(path)


def main() -> None:
    """Serve a synthetic cluster (for ``make bench``): prints the URL, then waits for stdin EOF."""
    import random
    import sys

    from tests.helpers.builders import cluster_node, cluster_pod, live_pod

    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--ignore-limit", action="store_true", help="send every list whole")
    parser.add_argument(
        "--live-pods", action="store_true", help="pods as a live API server lists them (~10 KB)"
    )
    args = parser.parse_args()
    rng = random.Random(1)
    cluster = Cluster(bookmark_every=5.0, ignore_limit=args.ignore_limit)
    cluster.load("nodes", (cluster_node(i) for i in range(args.nodes)))
    build = live_pod if args.live_pods else cluster_pod
    pods = [build(i, args.nodes, rng) for i in range(args.pods)]
    cluster.load("pods", pods)
    cluster.freeze_lists()
    # Churn recorded after the list: every event reaches the informer through its watch.
    for i in itertools.islice(itertools.cycle(range(args.pods)), args.events):
        pod = pods[i]
        pod["metadata"]["labels"] = {"generation": str(i)}
        cluster.put("pods", pod)
    server = FakeApiServer(cluster)
    print(server.url, flush=True)
    sys.stdin.read()
    server.close()


if __name__ == "__main__":
    main()
