"""Everything the commands print: results as text, JSON or YAML, and the progress line.

Text is for people: one line per object with its reasons indented under it, counts and input
errors on stderr so that a pipe carries only results. JSON and YAML carry the same facts for
programs, input errors included.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import click
import orjson
import yaml

from ..kube.timestamps import format_rfc3339 as rfc3339

if TYPE_CHECKING:
    from pathlib import Path

    from ..audit import Finding, Report
    from ..certs import Issued
    from ..dryrun import Result, Summary
    from ..explain import Explanation
    from ..formats.manifests import ManifestError
    from ..policytest import SuiteRun
    from .options import ClusterView


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


def _wrapped(text: str, indent: str, stream=None) -> str:
    """``text`` wrapped to the terminal's width when printed on one; whole on a pipe or in a
    file, where a program (or grep) reads it."""
    stream = stream or sys.stdout
    if not getattr(stream, "isatty", lambda: False)():
        return indent + text
    width = max(40, shutil.get_terminal_size().columns)
    return textwrap.fill(
        text, width=width, initial_indent=indent, subsequent_indent=indent + "  ", break_on_hyphens=False
    )


# -- check ----------------------------------------------------------------------------------

_VERDICT = {
    "deny": "DENY ",
    "patch": "PATCH",
    "warn": "WARN ",
    "allow": "ALLOW",
    "exempt": "EXEMPT",
    "skip": "SKIP ",
}
_FAILING = ("deny", "warn", "patch")


def cluster_json(view: ClusterView, now: float) -> dict[str, Any] | None:
    """What the run judged against, for programs: null without cluster state."""
    if view.state is None:
        return None
    return {
        "source": "live" if view.live else "snapshot",
        "nodes": len(view.state.nodes),
        "pods": view.facts.pods if view.facts is not None else len(view.state.pods),
        "judgedAt": rfc3339(now),
        "warnings": view.warnings,
    }


def cluster_text(view: ClusterView, now: float, *, told: bool) -> None:
    """On stderr: what the run judged against and when, and what the snapshot lacks."""
    if view.state is None:
        return
    source = "the live cluster" if view.live else "the snapshot"
    pods = view.facts.pods if view.facts is not None else len(view.state.pods)
    if told:
        when = "--now"
    elif view.live:
        when = "now"
    elif view.facts is not None and view.facts.newest is None:
        when = "now: the snapshot holds no timestamps; --now to change"
    else:
        when = "the snapshot's newest timestamp; --now to change"
    judged = f"judged at {rfc3339(now)} ({when}) against {source}: {len(view.state.nodes)} nodes, {pods} pods"
    click.echo(_wrapped(judged, "", sys.stderr), err=True)
    for warning in view.warnings:
        click.echo(_wrapped(f"WARNING {warning}", "", sys.stderr), err=True)


def check_report(
    results: list[Result],
    errors: list[ManifestError],
    summary: Summary,
    output: str,
    fail_only: bool,
    *,
    verbose: bool = False,
    cluster: dict[str, Any] | None = None,
) -> None:
    """``fail_only``: only what a CI log needs, the denials, warnings and patches. Text leaves
    skipped objects to the summary line unless ``verbose``."""
    if output == "text":
        for result in results:
            if (fail_only and result.verdict not in _FAILING) or (result.skipped and not verbose):
                continue
            _check_text(result)
        input_errors(errors)
        hidden = summary.skipped_kinds if summary.skipped and not verbose and not fail_only else ()
        kinds = ", ".join(f"{kind} {n}" for kind, n in hidden)
        click.echo(str(summary) + (f" (skipped: {kinds}; -v lists them)" if kinds else ""), err=True)
        return
    shown = [r for r in results if not fail_only or r.verdict in _FAILING]
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
        "summary": summary.as_json(),
        "cluster": cluster,
    }
    click.echo(dump(payload, output), nl=output == "json")


def _check_text(result: Result) -> None:
    decision = result.decision
    click.echo(f"{_VERDICT[result.verdict]} {_subject(result)}  ({result.location})")
    for v in decision.violations:
        click.echo(_wrapped(f"{v.reason}: {v.message}", "  "))
    for warning in decision.notices:
        click.echo(_wrapped(f"warning: {warning}", "  "))
    for v in decision.audited:
        click.echo(_wrapped(f"audit: {v.reason}: {v.message}", "  "))
    if result.exempted is not None:
        click.echo(f"  {result.exempted}")
    if decision.patch:
        click.echo("  patch:")
        click.echo(textwrap.indent(yaml.safe_dump(decision.patch, sort_keys=False).rstrip(), "    "))


def _subject(result: Result) -> str:
    name = f"{result.namespace}/{result.name}" if result.namespace else result.name
    return f"{result.kind} {name}"


def check_junit(results: list[Result], errors: list[ManifestError], path: str, warnings_fail: bool) -> None:
    """One test case per object (a suite per file): denials fail, and warnings with
    ``--warnings-as-errors``; kinds that create no pods are skipped; input errors are errors."""
    from ..formats.junit import Case, write

    cases = []
    for result in results:
        lines = [f"{v.reason}: {v.message}" for v in result.decision.violations]
        lines += [f"warning: {w}" for w in result.decision.notices]
        lines += [str(result.exempted)] if result.exempted else []
        failed = result.verdict == "deny" or (warnings_fail and result.verdict in ("warn", "patch"))
        cases.append(
            Case(
                suite=result.location.file,
                name=f"{_subject(result)} ({result.location})",
                classname=result.kind,
                failure="\n".join(lines) if failed else None,
                skipped="creates no pods: nothing to check" if result.skipped else None,
                output="" if failed else "\n".join(lines),
            )
        )
    for error in errors:
        cases.append(
            Case(suite=error.location.file, name=str(error.location), classname="input", error=error.message)
        )
    write(cases, path, "admit-guard check")


class Progress:
    """``checked N objects...`` on a terminal's stderr, for runs over a second; never on a pipe.
    ``line`` says what is counted (``read {:,} snapshot objects...``)."""

    def __init__(
        self,
        stream,
        *,
        clock=time.monotonic,
        after: float = 1.0,
        every: float = 0.25,
        line: str = "checked {} objects...",
    ) -> None:
        self._stream = stream
        self._line = line
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
            self._stream.write("\r" + self._line.format(count))
            self._stream.flush()
            self._shown = True
            self._next = now + self._every

    def done(self) -> None:
        if self._shown:
            self._stream.write("\r\033[K")  # clear the line before the results
            self._stream.flush()
            self._shown = False


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


def audit_report(report: Report, output: str, now: float, warnings: list[str] = ()) -> None:
    """``policyreport``: the findings as PolicyReports, at the time the audit judged them.
    ``warnings``: what the input lacks (on stderr, and in the JSON summary)."""
    from ..audit import policy_reports

    body = report.as_json()
    body["summary"]["warnings"] = list(warnings)
    if output == "json":
        click.echo(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode())
    elif output == "yaml":
        click.echo(yaml.safe_dump(body, sort_keys=False), nl=False)
    elif output == "policyreport":
        kubernetes_objects(policy_reports(report, now))
    else:
        click.echo(audit_tables(report), nl=False)
    if output != "text":
        return
    scanned = report.scanned
    line = (
        f"scanned {scanned['nodes']} nodes, {scanned['pods']} pods ({scanned['rejectedPods']} rejected by "
        f"the kubelet), {scanned['workloads']} workloads; judged at {rfc3339(now)}"
    )
    click.echo(_wrapped(line, "", sys.stderr), err=True)
    for why, types in _by_reason(report.not_judged).items():
        click.echo(_wrapped(f"not judged: {', '.join(types)}: {why}", "", sys.stderr), err=True)
    for warning in warnings:
        click.echo(_wrapped(f"WARNING {warning}", "", sys.stderr), err=True)
    counts = ", ".join(f"{n} {t}" for t, n in report.summary["byType"].items() if n)
    click.echo(f"{len(report.findings)} findings{': ' + counts if counts else ''}", err=True)


def _by_reason(not_judged: dict[str, str]) -> dict[str, list[str]]:
    """The finding types not judged, grouped by why: one line per missing input."""
    grouped: dict[str, list[str]] = {}
    for finding_type, why in not_judged.items():
        grouped.setdefault(why, []).append(finding_type)
    return grouped


def audit_junit(report: Report, path: str) -> None:
    """One failing test case per finding (a suite per finding type), one passing case per
    type found clean, one skipped case per type the input could not show."""
    from ..audit import TYPES
    from ..formats.junit import Case, write

    cases = [
        Case(
            suite=f.type,
            name=f"{f.kind} {f.namespace + '/' if f.namespace else ''}{f.name or '-'}"
            + (f" {f.resource}" if f.resource else ""),
            classname=f.severity,
            failure=f.message,
        )
        for f in report.findings
    ]
    found = {f.type for f in report.findings}
    for finding_type in TYPES:
        if finding_type in found:
            continue
        why = report.not_judged.get(finding_type)
        cases.append(Case(suite=finding_type, name=f"no {finding_type} findings", skipped=why))
    write(cases, path, "admit-guard audit")


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
