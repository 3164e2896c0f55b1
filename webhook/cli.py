"""The ``admit-guard`` command line: the engine's dry-run face for CI and for people."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import orjson
import yaml

from . import KUBERNETES_VERSION, policytest
from .config import ClientAuth, Config, ConfigError, load_config
from .engine import Decision, evaluate
from .kube.errors import FieldError
from .kube.workloads import pod_shape
from .manifests import Document, Location, ManifestError, read_documents
from .state import ClusterState
from .state.snapshot import SnapshotError, collector_paused, load_snapshot

EXIT_DENIED = 1
EXIT_INPUT_ERROR = 2


class InputError(click.ClickException):
    """Unusable config or cluster snapshot: exit 2, like every other input error."""

    exit_code = EXIT_INPUT_ERROR


@dataclass(frozen=True, slots=True)
class Result:
    """One checked object: where it was, what it is, and the verdict. The object itself is not
    kept: tens of thousands of them would stay alive until the report."""

    location: Location
    kind: str
    namespace: str | None  # None for objects that carry none and are not workloads
    name: str
    decision: Decision
    skipped: bool  # the kind creates no pods: nothing to check

    @classmethod
    def of(cls, doc: Document, decision: Decision) -> Result:
        skipped = pod_shape(doc.obj) is None
        metadata = _metadata(doc.obj)
        # Cluster-scoped kinds have no namespace, and ``default/`` would be a lie.
        namespace = (
            str(metadata["namespace"]) if metadata.get("namespace") else (None if skipped else "default")
        )
        name = str(metadata.get("name") or metadata.get("generateName") or "")
        return cls(doc.location, doc.obj["kind"], namespace, name, decision, skipped)

    @property
    def verdict(self) -> str:
        if self.skipped:
            return "skip"
        if not self.decision.allowed:
            return "deny"
        if self.decision.patch:
            return "patch"
        return "warn" if self.decision.notices else "allow"

    def as_json(self) -> dict[str, Any]:
        location = self.location
        return {
            "file": location.file,
            "document": location.document,
            "item": location.item,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "allowed": self.decision.allowed,
            "skipped": self.skipped,
            "violations": [
                {"policy": v.policy, "reason": v.reason, "message": v.message, "node": v.node}
                for v in self.decision.violations
            ],
            "warnings": self.decision.notices,
            "patch": self.decision.patch,
        }


def _metadata(obj: dict[str, Any]) -> dict[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


@dataclass(frozen=True, slots=True)
class Summary:
    """How many objects got each verdict; the counts partition the objects and errors."""

    allowed: int
    denied: int
    warned: int
    skipped: int
    errors: int

    @classmethod
    def of(cls, results: list[Result], errors: list[ManifestError]) -> Summary:
        verdicts = [r.verdict for r in results]
        return cls(
            allowed=verdicts.count("allow"),
            denied=verdicts.count("deny"),
            warned=verdicts.count("warn") + verdicts.count("patch"),
            skipped=verdicts.count("skip"),
            errors=len(errors),
        )

    def __str__(self) -> str:
        total = self.allowed + self.denied + self.warned + self.skipped
        return (
            f"{total} objects: {self.allowed} allowed, {self.denied} denied, {self.warned} warned, "
            f"{self.skipped} skipped, {self.errors} input errors"
        )


def _load_config(path: str | None) -> Config:
    if path is None:
        return Config()
    try:
        return load_config(path)
    except ConfigError as err:
        raise InputError(str(err)) from None


def _load_state(paths: tuple[str, ...], config: Config | None = None) -> ClusterState | None:
    if not paths:
        return None
    try:
        return load_snapshot(paths, config.storm_breaker if config is not None else None)
    except SnapshotError as err:
        raise InputError("cluster snapshot:\n  " + "\n  ".join(err.problems)) from None


def _state_for(
    cluster: tuple[str, ...], kubeconfig: str | None, context: str | None, config: Config | None = None
) -> ClusterState | None:
    """Snapshot files, or one list of a live cluster; None when neither is given. With a
    config, Failed pods feed its storm breakers."""
    if not (kubeconfig or context):
        return _load_state(cluster, config)
    _wants_live(cluster, kubeconfig, context)
    from .state.apiserver import ApiError
    from .state.informer import live_snapshot
    from .state.rejections import StormBreakers

    storm = StormBreakers.from_config(config.storm_breaker) if config is not None else None
    try:
        return live_snapshot(_api_server(kubeconfig, context), storm=storm)
    except ApiError as err:
        raise InputError(f"cannot list nodes and pods: {err}") from None


def live_cluster_options(command):
    """``--kubeconfig`` / ``--context``: read state from a live API server."""
    command = click.option("--context", help="kubeconfig context for live cluster state.")(command)
    return click.option(
        "--kubeconfig",
        type=click.Path(dir_okay=False),
        help="Read nodes and pods live from this cluster (in a pod: the service account).",
    )(command)


def _wants_live(cluster: tuple[str, ...], kubeconfig: str | None, context: str | None) -> bool:
    if cluster and (kubeconfig or context):
        raise InputError("--cluster and --kubeconfig/--context are exclusive: one source of state")
    return bool(kubeconfig or context) or (not cluster and "KUBERNETES_SERVICE_HOST" in os.environ)


def _api_server(kubeconfig: str | None, context: str | None):
    from kubernetes.config.config_exception import ConfigException

    from .state.apiserver import ApiServer

    try:
        return ApiServer.connect(kubeconfig, context)
    except (ConfigException, OSError, ValueError) as err:
        raise InputError(f"cannot use the cluster credentials: {err}") from None


def _version_line() -> str:
    from importlib.metadata import version

    rules = f"kubelet admission rules of Kubernetes {KUBERNETES_VERSION}"
    return f"admit-guard {version('admit-guard')} ({rules})"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="admit-guard", message=_version_line())
def main() -> None:
    """Stop pinned-nodeName pod storms and mixed-scheduler device conflicts before they start."""


@main.command()
def version() -> None:
    """The package version and the Kubernetes version whose kubelet rules it follows."""
    click.echo(_version_line())


@main.command()
@click.option(
    "-f",
    "--filename",
    "files",
    multiple=True,
    required=True,
    help="Manifest file or directory (repeatable); '-' reads stdin.",
)
@click.option(
    "--cluster",
    "cluster",
    multiple=True,
    help="Cluster snapshot: 'kubectl get nodes,pods -A -o yaml' output (repeatable).",
)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Policy config file.")
@click.option(
    "-o", "--output", type=click.Choice(["text", "json", "yaml"]), default="text", show_default=True
)
@click.option(
    "--operation", type=click.Choice(["CREATE", "UPDATE"]), default="CREATE", show_default=True, hidden=True
)
@click.option("--as", "user", default="", help="Evaluate as this user (for exemptions), like kubectl.")
@click.option("--as-group", "groups", multiple=True, help="Evaluate as a member of this group (repeatable).")
@click.option("--warnings-as-errors", is_flag=True, help="Exit 1 when any warning was given.")
@click.option("-q", "--fail-only", is_flag=True, help="Print only denials, warnings and input errors.")
@live_cluster_options
def check(
    files,
    cluster,
    config_path,
    output,
    operation,
    user,
    groups,
    warnings_as_errors,
    fail_only,
    kubeconfig,
    context,
) -> None:
    """Check manifests as the admission webhook would.

    Objects that create no pods are reported as skipped. Exit status: 0 all allowed (or
    skipped), 1 any denied (or warned, with --warnings-as-errors), 2 usage or input error.
    """
    config = _load_config(config_path)
    state = _state_for(cluster, kubeconfig, context, config)
    progress = Progress(sys.stderr)
    # Tens of thousands of objects stay alive until the report is printed: the collector's
    # full passes over them would cost as much as the parse, and they hold no cycles.
    with collector_paused():
        results, errors = _check_all(files, state, config, operation, user, groups, progress)
        progress.done()
        summary = Summary.of(results, errors)
        _report(results, errors, summary, output, fail_only)
    if errors:
        sys.exit(EXIT_INPUT_ERROR)
    if summary.denied or (warnings_as_errors and summary.warned):
        sys.exit(EXIT_DENIED)


def _report(
    results: list[Result], errors: list[ManifestError], summary: Summary, output: str, fail_only
) -> None:
    if output == "text":
        _print_text(results, errors, fail_only)
        click.echo(str(summary), err=True)
    else:
        shown = [r for r in results if not fail_only or r.verdict in ("deny", "warn", "patch")]
        payload = {
            "results": [r.as_json() for r in shown],
            "errors": [
                {
                    "file": e.location.file,
                    "document": e.location.document,
                    "item": e.location.item,
                    "message": e.message,
                }
                for e in errors
            ],
            "summary": asdict(summary),
        }
        click.echo(_dump(payload, output), nl=output == "json")


def _check_all(files, state, config, operation, user, groups, progress):
    """Every document of ``files`` through the engine: (results, input errors)."""
    results: list[Result] = []
    errors: list[ManifestError] = []
    for doc in read_documents(files):
        progress.tick(len(results) + len(errors))
        if isinstance(doc, ManifestError):
            errors.append(doc)
            continue
        try:
            decision = evaluate(
                doc.obj, operation, state, config, user=user, groups=tuple(groups), now=time.time()
            )
            if decision.unreadable:
                raise decision.unreadable
        except FieldError as err:
            errors.append(ManifestError(doc.location, f"{doc.obj['kind']}: field {err}"))
            continue
        results.append(Result.of(doc, decision))
    return results, errors


def _dump(payload: Any, output: str) -> str:
    if output == "yaml":
        return yaml.safe_dump(payload, sort_keys=False, allow_unicode=True)
    return orjson.dumps(payload, option=orjson.OPT_INDENT_2).decode()


_VERDICT = {"deny": "DENY ", "patch": "PATCH", "warn": "WARN ", "allow": "ALLOW", "skip": "SKIP "}


def _print_text(results: list[Result], errors: list[ManifestError], fail_only: bool) -> None:
    for result in results:
        if fail_only and result.verdict not in ("deny", "warn", "patch"):
            continue
        decision = result.decision
        name = f"{result.namespace}/{result.name}" if result.namespace else result.name
        click.echo(f"{_VERDICT[result.verdict]} {result.kind} {name}  ({result.location})")
        for v in decision.violations:
            click.echo(f"  {v.reason}: {v.message}")
        for warning in decision.notices:
            click.echo(f"  warning: {warning}")
        for v in decision.audited:
            click.echo(f"  audit: {v.reason}: {v.message}")
        if decision.patch:
            click.echo("  patch:")
            click.echo(textwrap.indent(yaml.safe_dump(decision.patch, sort_keys=False).rstrip(), "    "))
    for error in errors:
        click.echo(f"ERROR {error}", err=True)


class Progress:
    """``checked N objects...`` on a terminal's stderr, for runs over a second; never on a pipe."""

    def __init__(self, stream, *, clock=time.monotonic, after: float = 1.0, every: float = 0.25) -> None:
        self._stream = stream
        self._clock = clock
        self._start = clock()
        self._after, self._every = after, every
        self._next = self._start + after
        self._shown = False
        self._live = bool(getattr(stream, "isatty", lambda: False)())

    def tick(self, count: int) -> None:
        if not self._live:
            return
        now = self._clock()
        if now >= self._next:
            self._stream.write(f"\rchecked {count} objects...")
            self._stream.flush()
            self._shown = True
            self._next = now + self._every

    def done(self) -> None:
        if self._shown:
            self._stream.write("\r\033[K")  # clear the line before the results
            self._stream.flush()


@main.command()
@click.option("-f", "--filename", "files", multiple=True, required=True, help="Manifest file or directory.")
@click.option("--cluster", "cluster", multiple=True, help="Cluster snapshot file or directory (repeatable).")
@click.option(
    "-o", "--output", type=click.Choice(["text", "json", "yaml"]), default="text", show_default=True
)
@live_cluster_options
def explain(files, cluster, output, kubeconfig, context) -> None:
    """Where could each pod go? The kubelet's verdict on every node, as if it were bound there.

    Exit status: 0 every object fits somewhere, 1 some object fits on no node, 2 input error.
    """
    from .explain import explain as explain_object

    if not cluster and not (kubeconfig or context):
        raise InputError("explain needs cluster state: --cluster SNAPSHOT or --kubeconfig/--context")
    state = _state_for(cluster, kubeconfig, context)
    explanations, errors = [], []
    for doc in read_documents(files):
        if isinstance(doc, ManifestError):
            errors.append(doc)
            continue
        try:
            explanation = explain_object(doc.obj, state)
        except FieldError as err:
            errors.append(ManifestError(doc.location, f"{doc.obj['kind']}: field {err}"))
            continue
        if explanation is not None:
            explanations.append(explanation)
    if output == "text":
        for e in explanations:
            click.echo(f"{e.kind} {e.namespace}/{e.name}: {e.summary}")
            for v in e.nodes:
                verdict = "admit" if v.admit else "reject"
                click.echo(f"  {v.node:30} {verdict:6}  {', '.join(v.reasons)}".rstrip())
    else:
        click.echo(_dump({"results": [e.as_json() for e in explanations]}, output), nl=output == "json")
    for error in errors:
        click.echo(f"ERROR {error}", err=True)
    if errors:
        sys.exit(EXIT_INPUT_ERROR)
    if any(e.admitting == 0 for e in explanations):
        sys.exit(EXIT_DENIED)


@main.command("test")
@click.argument("paths", nargs=-1, required=True)
@click.option("--run", "pattern", help="Only cases whose name matches this regular expression.")
@click.option(
    "-o",
    "--output",
    "junit",
    nargs=2,
    type=(click.Choice(["junit"]), click.Path(dir_okay=False)),
    help="Also write results as JUnit XML: -o junit FILE.",
)
@click.option("--junit", "junit_file", type=click.Path(dir_okay=False), help="Same as -o junit FILE.")
def test_command(paths, pattern, junit, junit_file) -> None:
    """Run policy test files (*.test.yaml under directories) through the engine.

    Exit status: 0 all passed, 1 any failed, 2 invalid test files.
    """
    files, problems = [], []
    for path in policytest.discover(list(paths)):
        try:
            files.append(policytest.load_test_file(path))
        except policytest.TestFileError as err:
            problems.append(str(err))
    if not files and not problems:
        problems.append(f"no *{policytest.SUFFIX} files under {', '.join(paths)}")
    cases = policytest.select([(f, c) for f in files for c in f.cases], pattern)
    results = [policytest.run_case(f, c) for f, c in cases]
    for result in results:
        click.echo(f"{'PASS' if result.passed else 'FAIL'}  {result.file}  {result.name}")
        for failure in result.failures:
            click.echo("      " + failure.replace("\n", "\n      "))
    for problem in problems:
        click.echo(f"ERROR {problem}", err=True)
    failed = sum(not r.passed for r in results)
    click.echo(f"{len(results) - failed} passed, {failed} failed")
    for target in {junit[1] if junit else None, junit_file} - {None}:
        policytest.write_junit(results, target)
    if problems:
        sys.exit(EXIT_INPUT_ERROR)
    if failed:
        sys.exit(EXIT_DENIED)


@main.command()
@click.option("--service", default="admit-guard", show_default=True, help="The webhook Service's name.")
@click.option("--namespace", default="admit-guard", show_default=True, help="The Service's namespace.")
@click.option(
    "--out", type=click.Path(file_okay=False, path_type=Path), default=Path("certs"), show_default=True
)
@click.option("--force", is_flag=True, help="Replace an existing CA (the webhooks' caBundle changes).")
@click.option("--renew", is_flag=True, help="New serving certificate from the existing CA (same ca.crt).")
def certs(service, namespace, out, force, renew) -> None:
    """Write a CA and a serving certificate (ca.crt, ca.key, tls.crt, tls.key) for the Service.

    Prints the base64 caBundle on stdout, for the webhook configurations. An existing CA is
    never replaced without --force; --renew rotates the serving certificate only.
    """
    from .certs import CertificateError, issue
    from .certs import renew as renew_serving

    if force and renew:
        raise click.UsageError("--force and --renew are exclusive: replace the CA, or keep it")
    try:
        if out.exists() and not out.is_dir():
            raise InputError(f"{out}: not a directory")
        if renew:
            try:
                issued = renew_serving(service, namespace, out)
            except CertificateError as err:
                raise InputError(f"{err} (create a CA first: admit-guard certs --out {out})") from None
            written = "tls.crt tls.key (ca.crt kept)"
        else:
            existing = [name for name in ("ca.crt", "ca.key") if (out / name).exists()]
            if existing and not force:
                raise InputError(
                    f"{out} holds a CA ({' '.join(existing)}): replacing it invalidates the webhooks' "
                    "caBundle. Use --renew to rotate the serving certificate, or --force to replace the CA."
                )
            issued = issue(service, namespace, out)
            written = "ca.crt ca.key tls.crt tls.key"
    except OSError as err:
        raise InputError(f"{out}: cannot write certificates here ({err.strerror or err})") from None
    click.echo(f"wrote {out}/{written} for {', '.join(issued.dns_names)}, 127.0.0.1", err=True)
    click.echo(issued.ca_bundle)


@main.command()
@click.option("--cluster", multiple=True, help="Cluster snapshot file or directory (repeatable).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Policy config file.")
@click.option(
    "--cert-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("certs"),
    show_default=True,
    help="Directory with tls.crt and tls.key; re-read when they change.",
)
@click.option("--bind", default="0.0.0.0:8443", show_default=True, help="Address to listen on (HTTPS).")
@click.option("--workers", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option(
    "--threads", type=click.IntRange(1, 256), default=4, show_default=True, help="Threads per worker."
)
@click.option("--max-body-bytes", type=click.IntRange(1024), default=3 * 1024 * 1024, show_default=True)
@click.option(
    "--request-timeout",
    type=click.FloatRange(0.1),
    default=10.0,
    show_default=True,
    help="Seconds a client has to complete the TLS handshake and send a whole request (else 408).",
)
@click.option(
    "--first-byte-timeout",
    type=click.FloatRange(0.1),
    default=3.0,
    show_default=True,
    help="Seconds a new connection may stay silent before it is closed (at most --request-timeout).",
)
@click.option(
    "--worker-connections",
    type=click.IntRange(16),
    default=4096,
    show_default=True,
    help="Open connections per worker; at the limit the oldest idle one is closed for a new client.",
)
@click.option(
    "--max-buffered-bytes",
    type=click.IntRange(64 * 1024),
    help="Request bytes a worker buffers at once, past which requests get 503 with Retry-After "
    "(default: a quarter of the container's memory limit split across the workers, else 128 MiB).",
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
    help="Allowed common name of a client certificate (repeatable; default: any the CA signed). "
    "Overrides clientAuth.commonNames.",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info")
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
    live from the API server with the pod's service account. Each worker runs its own
    informer, so a worker never waits on another process to answer a review.
    """
    for name in ("tls.crt", "tls.key"):
        if not (cert_dir / name).is_file():
            raise InputError(
                f"{cert_dir / name}: missing; create it with 'admit-guard certs --out {cert_dir}'"
            )
    config = _load_config(config_path)
    client_auth = _client_auth(config, client_ca, client_cns)
    live = _wants_live(cluster, kubeconfig, context)
    if live:
        _api_server(kubeconfig, context)  # fail now, not in every worker
    state = None if live else _load_state(cluster, config)
    _metrics_dir()
    reservations = _shared_directory("admit-guard-reservations-")  # the workers' LocalTable
    # Imported only now: the metrics client picks its multi-process mode at import time.
    from .binding import BindGuard
    from .server import create_app, log_decisions_to_stderr, log_events_to_stderr
    from .serving import GuardServer, ServeOptions
    from .state.informer import Informer, Timing
    from .state.rejections import StormBreakers
    from .state.reservations import LeaseStore, LocalTable
    from .state.source import FixedState

    def app():
        """Runs in each worker after the fork: threads and connections are per process."""
        local = LocalTable(reservations)
        if live:
            storm = StormBreakers.from_config(config.storm_breaker)
            source = Informer(_api_server(kubeconfig, context), Timing(max_age=max_state_age), storm).start()
            leases = LeaseStore(_api_server(kubeconfig, context), _guard_namespace(config))
            return create_app(
                config,
                source,
                source_name="informer",
                max_body_bytes=max_body_bytes,
                audit_interval=audit_interval,
                bind_guard=BindGuard(config, local, leases),
                require_client_cert=client_auth is not None,
            )
        # The snapshot was loaded once, before the fork: workers share its pages.
        return create_app(
            config,
            FixedState(state),
            max_body_bytes=max_body_bytes,
            audit_interval=audit_interval,
            bind_guard=BindGuard(config, local),
            require_client_cert=client_auth is not None,
        )

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
    GuardServer(app, options).run()


def _client_auth(config: Config, client_ca: Path | None, client_cns: tuple[str, ...]) -> ClientAuth | None:
    """Who may call the admission paths: the flags over the config file's ``clientAuth``. The CA
    file must load now: a typo would otherwise fail every worker's first handshake."""
    import ssl

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


def _guard_namespace(config: Config) -> str:
    """Where the coordination Leases live: the configured namespace, else the guard's own
    (``ADMIT_GUARD_NAMESPACE``, from the downward API in deploy/)."""
    return config.node_admission.reservations.namespace or os.environ.get(
        "ADMIT_GUARD_NAMESPACE", "admit-guard"
    )


def _shared_directory(prefix: str) -> Path:
    """A fresh directory made before the fork, shared by the workers, removed at exit."""
    created, owner = tempfile.mkdtemp(prefix=prefix), os.getpid()
    atexit.register(lambda: os.getpid() == owner and shutil.rmtree(created, ignore_errors=True))
    return Path(created)


def _metrics_dir() -> None:
    """A fresh directory for the workers' metric files (stale files would skew counters)."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        for stale in Path(directory).glob("*.db"):
            stale.unlink()
    else:
        created, owner = tempfile.mkdtemp(prefix="admit-guard-metrics-"), os.getpid()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = created
        # Workers inherit atexit hooks; only the process that made the directory removes it.
        atexit.register(lambda: os.getpid() == owner and shutil.rmtree(created, ignore_errors=True))


@main.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Policy config file.")
def vap(config_path) -> None:
    """Print the state-free policies as ValidatingAdmissionPolicy + binding (YAML).

    They hold inside the API server even while the guard is down. Exemptions, excluded
    namespaces and the namespace opt-out label are rendered too; exit 2 names an exemption
    that cannot be expressed.
    """
    import yaml

    from .vap import VapError, render

    try:
        rendered = render(_load_config(config_path))
    except VapError as err:
        raise InputError(f"cannot render the static policy: {err}") from None
    click.echo(yaml.safe_dump_all(rendered, sort_keys=False), nl=False)


@main.command()
@click.option(
    "--cluster",
    "cluster",
    multiple=True,
    help="Cluster snapshot: 'kubectl get nodes,pods,deployments,replicasets,statefulsets,daemonsets,"
    "jobs,cronjobs,replicationcontrollers -A -o yaml' output (repeatable).",
)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Policy config file.")
@click.option(
    "-o",
    "--output",
    type=click.Choice(["text", "json", "yaml", "policyreport"]),
    default="text",
    show_default=True,
    help="policyreport: wgpolicyk8s.io/v1alpha2 PolicyReports per namespace and a ClusterPolicyReport.",
)
@live_cluster_options
def audit(cluster, config_path, output, kubeconfig, context) -> None:
    """Report what in the cluster already breaks the guard's rules, worst first.

    Pinned workloads (with the kubelet's verdict on their node), admission storms and their
    Failed pods, nodes where schedulers share a device, overcommitted nodes.
    Exit status: 0 clean, 1 findings, 2 usage or input error.
    """
    import time

    import yaml

    from . import audit as auditing
    from .state.apiserver import ApiError
    from .state.inventory import Progress, live_inventory, read_inventory

    config = _load_config(config_path)
    live = _wants_live(cluster, kubeconfig, context)
    if not live and not cluster:
        raise InputError("no cluster to audit: give --cluster SNAPSHOT... or --kubeconfig/--context")
    try:
        if live:
            inventory = live_inventory(_api_server(kubeconfig, context), progress=Progress())
        else:
            inventory = read_inventory(cluster)
    except SnapshotError as err:
        raise InputError("cluster objects:\n  " + "\n  ".join(err.problems)) from None
    except ApiError as err:
        raise InputError(f"cannot list the cluster's objects: {err}") from None
    now = time.time()
    report = auditing.run_audit(inventory, config, now)
    if output == "json":
        click.echo(orjson.dumps(report.as_json(), option=orjson.OPT_INDENT_2).decode())
    elif output == "yaml":
        click.echo(yaml.safe_dump(report.as_json(), sort_keys=False), nl=False)
    elif output == "policyreport":
        click.echo(yaml.safe_dump_all(auditing.policy_reports(report, now), sort_keys=False), nl=False)
    else:
        click.echo(auditing.render_text(report), nl=False)
        counts = ", ".join(f"{n} {t}" for t, n in report.summary["byType"].items() if n)
        click.echo(f"{len(report.findings)} findings{': ' + counts if counts else ''}", err=True)
    sys.exit(EXIT_DENIED if report.findings else 0)
