"""Everything the commands print: results as text, JSON or YAML, and the progress line.

Text is for people: one line per object with its reasons indented under it, counts and input
errors on stderr so that a pipe carries only results. JSON and YAML carry the same facts for
programs, input errors included.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import click
import orjson
import yaml

if TYPE_CHECKING:
    from pathlib import Path

    from ..audit import Finding, Report
    from ..certs import Issued
    from ..dryrun import Result, Summary
    from ..explain import Explanation
    from ..manifests import ManifestError
    from ..policytest import SuiteRun


def dump(payload: Any, output: str) -> str:
    if output == "yaml":
        return yaml.safe_dump(payload, sort_keys=False, allow_unicode=True)
    return orjson.dumps(payload, option=orjson.OPT_INDENT_2).decode()


def kubernetes_objects(objects: Iterable[dict[str, Any]]) -> None:
    """A YAML stream for ``kubectl apply -f -``."""
    click.echo(yaml.safe_dump_all(objects, sort_keys=False), nl=False)


def input_errors(errors: Iterable[object]) -> None:
    for error in errors:
        click.echo(f"ERROR {error}", err=True)


# -- check ----------------------------------------------------------------------------------

_VERDICT = {"deny": "DENY ", "patch": "PATCH", "warn": "WARN ", "allow": "ALLOW", "skip": "SKIP "}
_FAILING = ("deny", "warn", "patch")


def check_report(
    results: list[Result], errors: list[ManifestError], summary: Summary, output: str, fail_only: bool
) -> None:
    """``fail_only``: only what a CI log needs, the denials, warnings and patches."""
    shown = [r for r in results if not fail_only or r.verdict in _FAILING]
    if output == "text":
        for result in shown:
            _check_text(result)
        input_errors(errors)
        click.echo(str(summary), err=True)
        return
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
    click.echo(dump(payload, output), nl=output == "json")


def _check_text(result: Result) -> None:
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


# -- explain --------------------------------------------------------------------------------


def explanations(
    explained: list[Explanation], errors: list[ManifestError], output: str, summary_only: bool = False
) -> None:
    """Each pod's summary line, then (unless ``summary_only``) every node: fits, or why not in
    the scheduler's and the kubelet's words."""
    if output == "text":
        for e in explained:
            click.echo(f"{e.subject}: {e.summary}")
            if summary_only:
                continue
            for v in e.nodes:
                click.echo(f"  {v.node:30} {'fits' if v.fits else 'no':4}  {v.detail()}".rstrip())
    else:
        results = [e.as_json(nodes=not summary_only) for e in explained]
        click.echo(dump({"results": results}, output), nl=output == "json")
    input_errors(errors)


# -- audit ----------------------------------------------------------------------------------


def audit_report(report: Report, output: str, now: float) -> None:
    """``policyreport``: the findings as PolicyReports, at the time the audit judged them."""
    from ..audit import policy_reports

    if output == "json":
        click.echo(orjson.dumps(report.as_json(), option=orjson.OPT_INDENT_2).decode())
    elif output == "yaml":
        click.echo(yaml.safe_dump(report.as_json(), sort_keys=False), nl=False)
    elif output == "policyreport":
        kubernetes_objects(policy_reports(report, now))
    else:
        click.echo(audit_tables(report), nl=False)
        counts = ", ".join(f"{n} {t}" for t, n in report.summary["byType"].items() if n)
        click.echo(f"{len(report.findings)} findings{': ' + counts if counts else ''}", err=True)


_COLUMNS = ("SEVERITY", "NAMESPACE", "KIND", "NAME", "NODE", "RESOURCE", "COUNT")


def audit_tables(report: Report) -> str:
    """One table per finding type, each finding's message under its table."""
    if not report.findings:
        return "no findings\n"
    out: list[str] = []
    # Tables in the order of their worst finding, rows worst first.
    for finding_type in dict.fromkeys(f.type for f in report.findings):
        rows = [f for f in report.findings if f.type == finding_type]
        cells = [_cells(f) for f in rows]
        widths = [max(len(c[i]) for c in (_COLUMNS, *cells)) for i in range(len(_COLUMNS))]
        out.append(f"{finding_type} ({len(rows)})")
        for line in (_COLUMNS, *cells):
            out.append("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
        for i, finding in enumerate(rows, 1):
            out.append(f"  [{i}] {finding.message}")
        out.append("")
    return "\n".join(out)


def _cells(f: Finding) -> tuple[str, ...]:
    return (
        f.severity,
        f.namespace or "-",
        f.kind,
        f.name or "-",
        f.node or "-",
        f.resource or "-",
        str(f.count),
    )


# -- test -----------------------------------------------------------------------------------


def policy_tests(run: SuiteRun) -> None:
    """PASS/FAIL per case with each failure indented under it; the counts last."""
    for result in run.results:
        click.echo(f"{'PASS' if result.passed else 'FAIL'}  {result.file}  {result.name}")
        for failure in result.failures:
            click.echo("      " + failure.replace("\n", "\n      "))
    input_errors(run.problems)
    click.echo(f"{len(run.results) - run.failed} passed, {run.failed} failed")


# -- certs ----------------------------------------------------------------------------------


def certificates(out: Path, written: str, issued: Issued) -> None:
    """What was written where on stderr; the caBundle alone on stdout, for a pipe to kubectl."""
    click.echo(f"wrote {out}/{written} for {', '.join(issued.dns_names)}, 127.0.0.1", err=True)
    click.echo(issued.ca_bundle)
