"""JUnit XML, the report format CI systems (GitLab, Jenkins, GitHub test reporters) display.

One ``<testsuite>`` per group of cases; a case fails (``<failure>``), cannot run
(``<error>``), is skipped (``<skipped>``) or passes, with text for the log in
``<system-out>``. The layout is the common subset those readers agree on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from xml.etree import ElementTree as ET


@dataclass(frozen=True, slots=True)
class Case:
    suite: str
    name: str
    classname: str = ""
    failure: str | None = None  # the first line is the message, the rest the detail
    error: str | None = None
    skipped: str | None = None
    output: str = ""


def _counts(cases: list[Case]) -> dict[str, str]:
    """A suite's (or all suites') ``tests``, ``failures``, ``errors`` and ``skipped`` attributes."""
    return {
        "tests": str(len(cases)),
        "failures": str(sum(c.failure is not None for c in cases)),
        "errors": str(sum(c.error is not None for c in cases)),
        "skipped": str(sum(c.skipped is not None for c in cases)),
    }


def write(cases: Iterable[Case], path: str, name: str) -> None:
    """Write the cases to ``path``, grouped into suites in the order they first appear."""
    cases = list(cases)
    root = ET.Element("testsuites", name=name, **_counts(cases))
    suites: dict[str, list[Case]] = {}
    for case in cases:
        suites.setdefault(case.suite, []).append(case)
    for suite_name, members in suites.items():
        suite = ET.SubElement(root, "testsuite", name=suite_name, **_counts(members))
        for case in members:
            _case(suite, case)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def _case(suite: ET.Element, case: Case) -> None:
    element = ET.SubElement(suite, "testcase", classname=case.classname or case.suite, name=case.name)
    for tag, text in (("failure", case.failure), ("error", case.error), ("skipped", case.skipped)):
        if text is not None:
            ET.SubElement(element, tag, message=text.splitlines()[0] if text else "").text = text
    if case.output:
        ET.SubElement(element, "system-out").text = case.output
