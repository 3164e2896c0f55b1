"""``admit-guard serve``: the webhook over HTTPS under gunicorn."""

from __future__ import annotations

import errno
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..serve import limits
from .options import (
    InputError,
    cluster_option,
    config_option,
    live_cluster_options,
    load_config,
    reading_cluster,
    state_origin,
)

if TYPE_CHECKING:
    from ..config import ClientAuth, Config


@click.command()
@cluster_option("Cluster snapshot file or directory (repeatable).")
@config_option
@click.option(
    "--cert-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("certs"),
    show_default=True,
    help="Directory with tls.crt and tls.key; re-read when they change.",
)
@click.option("--bind", default="0.0.0.0:8443", show_default=True, help="Address to listen on (HTTPS).")
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=2,
    show_default=True,
    help="gunicorn worker processes, each with its own cluster state (about one per core).",
)
@click.option(
    "--threads",
    type=click.IntRange(1, 256),
    default=4,
    show_default=True,
    help="Threads per worker: reviews one worker judges at once.",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(1024),
    default=limits.MAX_BODY_BYTES,
    show_default=True,
    help="Largest AdmissionReview accepted; a larger body gets 413 (the API server's own limit is 3 MiB).",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(0.1),
    default=limits.REQUEST_TIMEOUT,
    show_default=True,
    help="Seconds a client has to complete the TLS handshake and send a whole request (else 408).",
)
@click.option(
    "--first-byte-timeout",
    type=click.FloatRange(0.1),
    default=limits.FIRST_BYTE_TIMEOUT,
    show_default=True,
    help="Seconds a new connection may stay silent before it is closed (at most --request-timeout).",
)
@click.option(
    "--worker-connections",
    type=click.IntRange(16),
    default=limits.WORKER_CONNECTIONS,
    show_default=True,
    help="Open connections per worker; at the limit the oldest idle one is closed for a new client.",
)
@click.option(
    "--max-buffered-bytes",
    type=click.IntRange(64 * 1024),
    help="What requests may cost a worker at once (bytes still arriving; whole requests at "
    f"{limits.PARSED_COST} times their size, for their parsed copies, until answered), past which "
    "requests get 503 with Retry-After (default: a quarter of the container's memory limit split "
    "across the workers, else 128 MiB).",
)
@click.option(
    "--client-ca",
    type=click.Path(dir_okay=False, path_type=Path),
    help="CA file: /validate and /mutate answer only clients with a certificate it signed "
    "(403 otherwise). Overrides clientAuth.ca in --config.",
)
@click.option(
    "--client-cn",
    "client_cns",
    multiple=True,
    help="Allowed common name of a client certificate: the subject's last CN, as Kubernetes reads "
    "it (repeatable; default: any the CA signed). Overrides clientAuth.commonNames.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="Least severe of gunicorn's and the guard's own log lines on stderr (breakers, watch retries).",
)
@click.option(
    "--max-state-age",
    type=click.FloatRange(1),
    default=300.0,
    show_default=True,
    help="Live state not refreshed (event or bookmark) for this many seconds is not trusted.",
)
@click.option(
    "--audit-interval",
    type=click.FloatRange(1),
    help="Audit the nodes of the server's state every so many seconds; findings become gauges (off).",
)
@live_cluster_options
def serve(
    cluster,
    config_path,
    cert_dir,
    bind,
    workers,
    threads,
    max_body_bytes,
    request_timeout,
    first_byte_timeout,
    worker_connections,
    max_buffered_bytes,
    client_ca,
    client_cns,
    log_level,
    max_state_age,
    audit_interval,
    kubeconfig,
    context,
) -> None:
    """Serve /validate and /mutate over HTTPS under gunicorn.

    State: --cluster snapshots, or live from --kubeconfig/--context, or (in a pod, with neither)
    live from the API server with the pod's service account. Live, the master lists the cluster
    once and the workers are forked from its state: they share its pages and watch on from
    it, so the replica holds one copy of the cluster whatever its worker count.
    """
    from ..serve import prefork

    for name in ("tls.crt", "tls.key"):
        if not (cert_dir / name).is_file():
            raise InputError(
                f"{cert_dir / name}: missing; create it with 'admit-guard certs --out {cert_dir}'"
            )
    config = load_config(config_path)
    client_auth = _client_auth(config, client_ca, client_cns)
    listenable(bind)
    origin = state_origin(cluster, kubeconfig, context)
    with reading_cluster():
        if origin.live:
            origin.connect()  # fail now, not in every worker
        state = None if origin.live else origin.snapshot(config.storm_breaker)
    prefork.metrics_directory()
    replica = prefork.replica_state(config, origin, max_state_age) if origin.live else None
    if audit_interval:
        prefork.replica_audit(config, replica, state, audit_interval)
    app = prefork.worker_app(
        config,
        origin,
        state,
        reservations=prefork.shared_directory("admit-guard-reservations-"),
        max_body_bytes=max_body_bytes,
        require_client_cert=client_auth is not None,
        replica=replica,
    )
    # Imported only now: the metrics client picks its multi-process mode at import time.
    from ..serve.app import log_decisions_to_stderr, log_events_to_stderr
    from ..serve.gunicorn import GuardServer, ServeOptions

    options = ServeOptions(
        bind=bind,
        cert_dir=cert_dir,
        workers=workers,
        threads=threads,
        log_level=log_level,
        request_timeout=request_timeout,
        first_byte_timeout=min(first_byte_timeout, request_timeout),
        max_body_bytes=max_body_bytes,
        max_buffered_bytes=max_buffered_bytes,
        worker_connections=worker_connections,
        client_auth=client_auth,
    )
    log_decisions_to_stderr()
    log_events_to_stderr(log_level)
    GuardServer(app, options, replica).run()


def _client_auth(config: Config, client_ca: Path | None, client_cns: tuple[str, ...]) -> ClientAuth | None:
    """Who may call the admission paths: the flags over the config file's ``clientAuth``. The CA
    file must load now: a typo would otherwise fail every worker's first handshake."""
    import ssl

    from ..config import ClientAuth

    configured = config.client_auth
    ca = str(client_ca) if client_ca is not None else (configured.ca if configured else None)
    if ca is None:
        if client_cns:
            raise InputError("--client-cn needs a client CA (--client-ca or clientAuth.ca in --config)")
        return None
    names = tuple(client_cns) or (configured.common_names if configured else ())
    try:
        ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as err:
        raise InputError(f"{ca}: cannot load the client CA: {err}") from None
    return ClientAuth(ca, names)


def listenable(bind: str) -> None:
    """Fail in one line when ``--bind`` cannot be listened on (gunicorn would retry for five
    seconds, log each try, and exit with a traceback-like message)."""
    host, _, port = bind.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    if not port.isdigit():
        raise InputError(f"--bind {bind}: expected HOST:PORT, e.g. 0.0.0.0:8443")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, OverflowError) as err:
        raise InputError(f"--bind {bind}: cannot resolve {host}: {err}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
        try:
            probe.bind(address)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise InputError(
                    f"--bind {bind}: address already in use (another server listens there); stop it "
                    "or choose another --bind"
                ) from None
            raise InputError(f"--bind {bind}: cannot listen there: {err.strerror or err}") from None
