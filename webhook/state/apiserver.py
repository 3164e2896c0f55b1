"""A minimal API server client: raw JSON lists and watch streams for nodes and pods.

Authentication comes from the kubernetes client's own loaders (in-cluster service account,
or a kubeconfig and context, including exec plugins and token refresh); the requests are
plain urllib3 so list pages and watch lines are parsed with orjson into compact records,
never into the client's generated models (which cost kilobytes per pod).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import urllib3

from ..formats.chunked import ChunkedDecoder, MalformedChunks
from . import waiting
from .gc_pause import collector_paused
from .list_body import UnreadableList, list_items

# A resource is one of these names, or the list path of a custom resource (``served_kinds``).
RESOURCES = {
    "nodes": "/api/v1/nodes",
    "pods": "/api/v1/pods",
    # Listed once by ``admit-guard audit``; the webhook's informer never reads them.
    "deployments": "/apis/apps/v1/deployments",
    "replicasets": "/apis/apps/v1/replicasets",
    "statefulsets": "/apis/apps/v1/statefulsets",
    "daemonsets": "/apis/apps/v1/daemonsets",
    "jobs": "/apis/batch/v1/jobs",
    "cronjobs": "/apis/batch/v1/cronjobs",
    "replicationcontrollers": "/api/v1/replicationcontrollers",
    # DRA, where the cluster serves resource.k8s.io/v1 (``serves``).
    "resourceslices": "/apis/resource.k8s.io/v1/resourceslices",
    "resourceclaims": "/apis/resource.k8s.io/v1/resourceclaims",
    "deviceclasses": "/apis/resource.k8s.io/v1/deviceclasses",
    # Alpha in 1.35 (feature gate DRADeviceTaints, off by default): most clusters answer 404.
    "devicetaintrules": "/apis/resource.k8s.io/v1alpha3/devicetaintrules",
    # The topology manager's inputs, published by an exporter (NFD topology-updater, RTE) where
    # installed: its CRD is absent elsewhere (404).
    "noderesourcetopologies": "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies",
}
DRA_GROUP_VERSION = "resource.k8s.io/v1"

# The largest watch event (one JSON line) the guard reads. The API server refuses objects over
# 3 MiB (etcd's limit is 1.5 MiB), so anything larger is not a Kubernetes object: a watch error.
MAX_EVENT_BYTES = 16 * 1024 * 1024
# A list response up to this size is parsed whole (orjson, one call); a larger one (a server
# that ignored ``limit``) is read one item at a time, so a relist's peak stays one page.
WHOLE_PAGE_BYTES = 8 * 1024 * 1024
_BLOCK = 65536


class ApiError(Exception):
    """A failed request; ``status`` is the HTTP or in-stream Status code (0 for transport)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


class EventTooLarge(ApiError):
    """A watch event longer than the cap: the stream is abandoned before it is buffered."""

    def __init__(self, limit: int) -> None:
        super().__init__(0, f"watch: an event longer than {limit} bytes")


@dataclass(slots=True)
class Page:
    """One list response. A streamed page (one larger than ``WHOLE_PAGE_BYTES``) reads its
    ``items`` as they are iterated, once, and sets its resourceVersion and continue token
    when they are done: read those after the items."""

    items: Iterable[Any]  # dicts; a ``decode`` of the informer's may give its own (``ListedPod``)
    resource_version: str
    continue_token: str


class ApiServer:
    """GET requests against one API server with the credentials of a kubernetes Configuration."""

    def __init__(self, configuration) -> None:
        self._configuration = configuration
        self.host = configuration.host.rstrip("/")
        tls: dict[str, Any] = {}
        if self.host.startswith("https"):
            tls = {
                "cert_reqs": "CERT_REQUIRED" if configuration.verify_ssl else "CERT_NONE",
                "ca_certs": configuration.ssl_ca_cert,
                "cert_file": configuration.cert_file,
                "key_file": configuration.key_file,
            }
        self._pool = urllib3.PoolManager(num_pools=2, maxsize=8, retries=False, **tls)
        self.whole_page_bytes = WHOLE_PAGE_BYTES

    @classmethod
    def connect(cls, kubeconfig: str | None = None, context: str | None = None) -> ApiServer:
        """In-cluster credentials when running in a pod and no kubeconfig is named, else kubeconfig."""
        from kubernetes import client, config

        configuration = client.Configuration()
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
        return cls(configuration)

    def list_page(
        self,
        resource: str,
        limit: int,
        continue_token: str = "",
        timeout: float = 60,
        decode: Callable[[bytes], Page | None] | None = None,
    ) -> Page:
        """One page of a list. ``decode`` reads a whole page where it can (None: it cannot, and
        the page is parsed as JSON); a page too large to be read whole is streamed."""
        blocks = self._page_blocks(resource, limit, continue_token, timeout)
        head, whole = _read_up_to(blocks, self.whole_page_bytes)
        if whole:
            return page_of(resource, b"".join(head), decode)
        return _streamed_page(resource, head, blocks)

    def page_body(
        self, resource: str, limit: int, continue_token: str = "", timeout: float = 60
    ) -> bytes | None:
        """One page of a list as its body; None when it is too large to be read whole (the
        request is abandoned: ``list_page`` streams such a page)."""
        blocks = self._page_blocks(resource, limit, continue_token, timeout)
        head, whole = _read_up_to(blocks, self.whole_page_bytes)
        if not whole:
            blocks.close()
            return None
        return b"".join(head)

    def _page_blocks(
        self, resource: str, limit: int, continue_token: str, timeout: float
    ) -> Generator[bytes]:
        fields: dict[str, Any] = {"limit": limit}
        if continue_token:
            fields["continue"] = continue_token
        return _body_blocks(resource, self._get(resource, fields, timeout=timeout, stream=True))

    def fresh(self) -> ApiServer:
        """The same API server and credentials, over connections of its own: a forked process
        must not share its parent's pooled sockets."""
        api = type(self)(self._configuration)
        api.whole_page_bytes = self.whole_page_bytes
        return api

    def served_kinds(self, groups: set[str], timeout: float = 30) -> dict[tuple[str, str], tuple[str, str]]:
        """Of the API groups in ``groups``, the kinds this API server serves (discovery: ``/apis``,
        then each group's preferred version): ``(group, kind)`` → (list path, apiVersion). A
        group it does not serve is simply absent."""
        status, body = self.request_json("GET", "/apis", timeout=timeout)
        if status == 404:
            return {}
        if status != 200:
            raise ApiError(status, f"discovery /apis: {_status_message(orjson.dumps(body))}")
        served: dict[tuple[str, str], tuple[str, str]] = {}
        for group in body.get("groups") or ():
            name = group.get("name") if isinstance(group, dict) else None
            preferred = (group.get("preferredVersion") or {}).get("groupVersion") if name in groups else None
            if not preferred:
                continue
            status, resources = self.request_json("GET", f"/apis/{preferred}", timeout=timeout)
            if status != 200:
                continue  # an aggregated API that is down: its kinds are not listed
            for resource in resources.get("resources") or ():
                plural, kind = resource.get("name") or "", resource.get("kind")
                if "/" not in plural and kind and "list" in (resource.get("verbs") or ()):
                    served[(name, kind)] = (f"/apis/{preferred}/{plural}", preferred)
        return served

    def watch(
        self, resource: str, resource_version: str, timeout_seconds: int, read_timeout: float
    ) -> urllib3.BaseHTTPResponse:
        """Open a watch; the caller reads lines with ``watch_lines`` and closes the response."""
        fields = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": timeout_seconds,
        }
        return self._get(resource, fields, timeout=read_timeout, stream=True)

    def serves(self, group_version: str, timeout: float = 10.0) -> bool:
        """Whether the API server serves ``group/version`` (discovery: 200, or 404 when not).

        Raises ``ApiError`` when it does not answer either way."""
        status, body = self.request_json("GET", f"/apis/{group_version}", timeout=timeout)
        if status == 404:
            return False
        if status != 200:
            raise ApiError(status, f"discovery of {group_version}: {body.get('message', '')}")
        return True

    def request_json(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, timeout: float = 5.0
    ) -> tuple[int, dict[str, Any]]:
        """One JSON request (the reservations' Leases): (HTTP status, decoded body).

        Raises ``ApiError`` only when no answer came (connection, timeout, unreadable body);
        a 404 or 409 is an answer the caller acts on.
        """
        waiting.before_waiting(f"the API server ({method} {path})")
        headers = self._headers()
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            response = self._pool.request(
                method,
                self.host + path,
                body=orjson.dumps(body) if body is not None else None,
                headers=headers,
                timeout=urllib3.Timeout(connect=timeout, read=timeout),
            )
            data = orjson.loads(response.data) if response.data else {}
        except (urllib3.exceptions.HTTPError, orjson.JSONDecodeError) as err:
            raise ApiError(0, f"{method} {path}: {err}") from None
        return response.status, data if isinstance(data, dict) else {}

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        for auth in self._configuration.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        return headers

    def _get(self, resource: str, fields: dict[str, Any], *, timeout: float, stream: bool):
        waiting.before_waiting(f"the API server (GET {resource})")
        headers = self._headers()
        try:
            response = self._pool.request(
                "GET",
                self.host + (resource if resource.startswith("/") else RESOURCES[resource]),
                fields=fields,
                headers=headers,
                timeout=urllib3.Timeout(connect=10, read=timeout),
                preload_content=not stream,
            )
        except urllib3.exceptions.HTTPError as err:
            raise ApiError(0, f"{resource}: {err}") from None
        if response.status != 200:
            message = _status_message(response.data if not stream else response.read(65536))
            response.release_conn()
            raise ApiError(response.status, f"{resource}: {message}")
        return response


def _body_blocks(resource: str, response) -> Iterator[bytes]:
    """The body of a list response in blocks; the connection goes back to the pool once it is
    read to the end, and is closed when the reader stops early."""
    read = False
    try:
        yield from response.stream(_BLOCK, decode_content=True)
        read = True
    except urllib3.exceptions.HTTPError as err:
        raise ApiError(0, f"list {resource}: {err}") from None
    finally:
        if not read:
            response.close()  # a connection read part way cannot carry another request
        response.release_conn()


def _read_up_to(blocks: Iterator[bytes], limit: int) -> tuple[list[bytes], bool]:
    """The blocks read until past ``limit`` bytes or the end, and whether that was the end."""
    head, size = [], 0
    for block in blocks:
        head.append(block)
        size += len(block)
        if size > limit:
            return head, False
    return head, True


def page_of(resource: str, body: bytes, decode: Callable[[bytes], Page | None] | None = None) -> Page:
    """A page read whole: by ``decode`` where it can, else parsed as JSON."""
    return (decode and decode(body)) or _whole_page(resource, body)


def _whole_page(resource: str, body: bytes) -> Page:
    try:
        with collector_paused():  # a page is ~20,000 objects, none of them garbage yet
            parsed = orjson.loads(body)
        metadata = parsed.get("metadata") or {}
        return Page(
            parsed.get("items") or [],
            str(metadata.get("resourceVersion") or ""),
            metadata.get("continue") or "",
        )
    except (orjson.JSONDecodeError, AttributeError) as err:
        raise ApiError(0, f"list {resource}: unreadable response: {err}") from None


def _streamed_page(resource: str, head: list[bytes], blocks: Generator[bytes]) -> Page:
    """A page read item by item: ``head`` was read already, ``blocks`` is the rest of the body."""
    page = Page([], "", "")

    def taken(read: list[bytes]) -> Iterator[bytes]:
        read.reverse()
        while read:
            yield read.pop()  # each block is freed once parsed, not at the end of the page

    def items() -> Iterator[dict[str, Any]]:
        metadata: dict[str, Any] = {}
        try:
            yield from list_items(itertools.chain(taken(head), blocks), metadata, MAX_EVENT_BYTES)
        except UnreadableList as err:
            raise ApiError(0, f"list {resource}: unreadable response: {err}") from None
        finally:
            blocks.close()
        page.resource_version = str(metadata.get("resourceVersion") or "")
        page.continue_token = metadata.get("continue") or ""

    page.items = items()
    return page


def watch_lines(response, max_event: int = MAX_EVENT_BYTES) -> Iterator[bytes]:
    """The newline-delimited events of a watch stream, as they arrive.

    An event's pieces are kept in a list and joined once, so a large event costs its length,
    not its length squared; past ``max_event`` bytes it is ``EventTooLarge``, never more memory.
    """
    fp = getattr(getattr(response, "_fp", None), "fp", None)
    plain = not response.headers.get("Content-Encoding")
    if getattr(response, "chunked", False) and plain and hasattr(fp, "read1"):
        blocks = _dechunked(fp)
    else:
        blocks = response.stream(_BLOCK, decode_content=True)
    pieces: list[bytes] = []  # the event that has no newline yet
    held = 0
    for block in blocks:
        lines = block.split(b"\n")
        if len(lines) == 1:
            pieces.append(block)
            held += len(block)
            if held > max_event:
                raise EventTooLarge(max_event)
            continue
        if pieces:
            if held + len(lines[0]) > max_event:
                raise EventTooLarge(max_event)
            pieces.append(lines[0])
            lines[0] = b"".join(pieces)
        tail = lines.pop()
        pieces, held = ([tail] if tail else []), len(tail)
        if held > max_event or (len(block) > max_event and max(map(len, lines)) > max_event):
            raise EventTooLarge(max_event)
        yield from (line for line in lines if line.strip())
    if pieces and (last := b"".join(pieces)).strip():
        yield last


def _dechunked(fp) -> Iterator[bytes]:
    """The body of a chunked response, read from its socket file in large reads.

    The API server sends every watch event as a chunk of its own; urllib3 costs a few
    microseconds of Python per chunk, the shared decoder (``webhook/formats/chunked.py``) a fraction of
    that. Yields, per read, the data of the chunks it completed, and the part of a chunk longer
    than the read as it arrives (so a large chunk is never copied again). Ends after the last
    chunk and its trailer section. The caller closes the connection (it is never reused after
    a watch).
    """
    decoder = ChunkedDecoder()
    rest = b""  # framing not read yet: a part of a chunk-size line, a CRLF or the trailers
    while not decoder.done:
        data = fp.read1(_BLOCK)
        if not data:
            raise ApiError(0, "watch: the stream ended before its last chunk")
        buffer = rest + data if rest else data
        parts: list[bytes] = []
        try:
            at = decoder.decode(buffer, 0, parts)
        except MalformedChunks as err:
            raise ApiError(0, f"watch: {err}") from None
        if parts:
            yield b"".join(parts)
        rest = buffer[at:]


def _status_message(body: bytes) -> str:
    try:
        status = orjson.loads(body)
        return str(status.get("message") or status.get("reason") or body[:200])
    except (orjson.JSONDecodeError, AttributeError):
        return body[:200].decode(errors="replace")
