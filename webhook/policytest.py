"""Policy test files: cluster state, config and cases with expected verdicts.

A test file (``*.test.yaml``) is run through the same ``evaluate`` the server uses, so a
platform team can prove in CI that a config change keeps the verdicts they rely on.
"""

from __future__ import annotations

import copy
import difflib
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from .config import Config, StormBreakerConfig, read_config
from .engine import Decision, evaluate
from .formats.manifests import Document, ManifestError, documents_in
from .formats.reader import Reader, ReadError, load_yaml
from .kube.errors import FieldError
from .kube.timestamps import rfc3339_seconds
from .state import ClusterState, node_from, pod_record
from .state.devices import DeviceIndex
from .state.model import object_key
from .state.snapshot import SnapshotError, load_snapshot
from .state.source import FixedState
from .state.storm import StormBreakers

API_VERSION = "admit-guard.io/v1alpha1"
KIND = "PolicyTest"
SUFFIX = ".test.yaml"
_CASE_KEYS = {
    "name",
    "object",
    "objectPath",
    "document",
    "operation",
    "oldObject",
    "oldObjectPath",
    "dryRun",
    "user",
    "groups",
    "config",
    "expect",
    "now",
    "bindTo",
}
_EXPECT_KEYS = {"allowed", "reasons", "messages", "warnings", "patched", "patchedPath"}


class TestFileError(ReadError):
    """An invalid test file; the message names the file and the field."""

    @classmethod
    def listing(cls, source: str, problems: list[str]) -> TestFileError:
        """One line per problem, each naming the file: a file's cases fail one by one."""
        return cls("\n".join(f"{source}: {problem}" for problem in problems))


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    obj: dict[str, Any]
    operation: str
    old_object: dict[str, Any] | None
    user: str
    groups: tuple[str, ...]
    config: Config
    expect: Mapping[str, Any]
    now: float  # when the case is asked (storm breakers compare times with it)
    bind_to: str | None = None  # a Binding case: the object is the pending pod, bound to this node


@dataclass(frozen=True, slots=True)
class TestFile:
    path: str
    cases: list[Case]
    state: ClusterState | None


@dataclass(slots=True)
class CaseResult:
    file: str
    name: str
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def discover(paths: list[str]) -> Iterator[str]:
    """Files given by name, and every ``*.test.yaml`` below the directories given."""
    for path in paths:
        p = Path(path)
        if p.is_dir():
            yield from sorted(str(f) for f in p.rglob(f"*{SUFFIX}"))
        else:
            yield path


def load_test_file(path: str) -> TestFile:
    where = Reader(str(path))
    data = load_yaml(path, TestFileError)
    if not isinstance(data, Mapping):
        raise TestFileError(f"{path}: top level: must be a mapping")
    data = where.mapping(data, "", {"apiVersion", "kind", "metadata", "cluster", "config", "cases"})
    if data.get("apiVersion") != API_VERSION or data.get("kind") != KIND:
        where.fail("apiVersion/kind", f"must be {API_VERSION} / {KIND}")
    base = _config_data(where, data.get("config"), "config")
    config = read_config(where.within("config"), base)
    state = _state(where, data.get("cluster"), config.storm_breaker)
    raw_cases = where.sequence(data.get("cases"), "cases")
    if data.get("cases") == []:
        where.fail("cases", "must list at least one case")
    cases = [_case(where, raw, f"cases[{i}]", base, config) for i, raw in enumerate(raw_cases)]
    where.finish(TestFileError)  # every problem of the file, in every case, at once
    return TestFile(path, [c for c in cases if c is not None], state)


def run_case(test_file: TestFile, case: Case) -> CaseResult:
    result = CaseResult(test_file.path, case.name)
    if case.bind_to is not None:
        _compare(case, _bind(test_file, case, result.failures), result.failures)
        return result
    try:
        decision = evaluate(
            case.obj,
            case.operation,
            test_file.state,
            case.config,
            old_object=case.old_object,
            user=case.user,
            groups=case.groups,
            now=case.now,
        )
        if decision.unreadable:
            raise decision.unreadable
    except FieldError as err:
        result.failures.append(f"the object is invalid: {err}")
        return result
    _compare(case, decision, result.failures)
    return result


def _bind(test_file: TestFile, case: Case, failures: list[str]) -> Decision:
    """A Binding of the case's pod (pending, added to the state for this case) to its node,
    through the webhook's pipeline and bind guard (no reservations: one bind per case)."""
    from .admission import VALIDATE, AdmissionRequest
    from .binding import BindGuard
    from .pipeline import Pipeline, route

    state = test_file.state if test_file.state is not None else ClusterState()
    spec = case.obj.get("spec") or {}
    if case.obj.get("kind") != "Pod" or not isinstance(spec, Mapping):
        failures.append("bindTo binds a Pod: the object must be a Pod whose spec is a mapping")
        return Decision()
    try:
        record = pod_record({**case.obj, "spec": {k: v for k, v in spec.items() if k != "nodeName"}})
    except FieldError as err:
        failures.append(f"the object is invalid: {err}")
        return Decision()
    metadata = case.obj.get("metadata") or {}
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": metadata.get("name", ""), "namespace": metadata.get("namespace", "default")},
        "target": {"kind": "Node", "name": case.bind_to},
    }
    request = AdmissionRequest(
        uid="test", operation="CREATE", kind="Binding", namespace=binding["metadata"]["namespace"],
        name=binding["metadata"]["name"], obj=binding, old_obj=None, user=case.user, groups=case.groups,
        dry_run=True, resource="pods", sub_resource="binding",
    )  # fmt: skip
    state.set_pod(record.key, record)
    try:
        pipeline = Pipeline(case.config, FixedState(state), bind_guard=BindGuard(case.config, None))
        outcome = pipeline.decide(route(request), VALIDATE, verified=True, now=case.now or 0.0)
    finally:
        state.remove_pod(record.key)
    decision = outcome.decision or Decision()
    decision.allowed = outcome.allowed
    decision.warnings = list(outcome.response.get("warnings", []))
    return decision


def _compare(case: Case, decision: Decision, failures: list[str]) -> None:
    expect = case.expect
    if "allowed" in expect and expect["allowed"] != decision.allowed:
        failures.append(f"allowed: expected {expect['allowed']}, got {decision.allowed}{_findings(decision)}")
    reasons = sorted({v.reason for v in (*decision.violations, *decision.audited)})
    if "reasons" in expect and sorted(set(expect["reasons"])) != reasons:
        failures.append(
            f"reasons: expected {sorted(set(expect['reasons']))}, got {reasons}{_findings(decision)}"
        )
    messages = [v.message for v in (*decision.violations, *decision.audited)]
    for wanted in expect.get("messages", []):
        if not any(wanted in m for m in messages):
            failures.append(f"no message contains {wanted!r}; messages: {messages}")
    for wanted in expect.get("warnings", []):
        if not any(wanted in w for w in decision.notices):
            failures.append(f"no warning contains {wanted!r}; warnings: {decision.notices}")
    if "patched" in expect:
        actual = (
            jsonpatch.apply_patch(copy.deepcopy(case.obj), decision.patch) if decision.patch else case.obj
        )
        if actual != expect["patched"]:
            failures.append("patched object differs:\n" + _diff(expect["patched"], actual))


def _findings(decision: Decision) -> str:
    """What the engine found, so a failed expectation says why without a second run."""
    lines = [f"denied by {v.reason}: {v.message}" for v in decision.violations]
    lines += [f"audited {v.reason}: {v.message}" for v in decision.audited]
    lines += [f"warning: {w}" for w in decision.notices]
    return "".join(f"\n  {line}" for line in lines) if lines else "\n  (no findings)"


def _diff(expected: Any, actual: Any) -> str:
    lines = difflib.unified_diff(
        yaml.safe_dump(expected, sort_keys=True).splitlines(),
        yaml.safe_dump(actual, sort_keys=True).splitlines(),
        "expected",
        "actual",
        lineterm="",
    )
    return "\n".join(lines)


def _merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge mappings; the override wins, lists are replaced whole."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _config_data(where: Reader, raw: Any, at: str, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{path, inline, override}`` → a config document (validated later, per case). A config
    file is read as ``serve`` and ``check`` read it: a duplicate key is an error here too."""
    raw = where.mapping(raw or {}, at, {"path", "inline", "override"})
    if "path" in raw and "inline" in raw:
        where.fail(at, "give path or inline, not both")
    data: Mapping[str, Any] = dict(base or {})
    config_path = _relative(where, raw["path"], f"{at}.path") if "path" in raw else None
    if config_path is not None:
        try:
            data = where.mapping(load_yaml(config_path) or {}, f"{at}.path")
        except ReadError as err:
            where.fail(f"{at}.path", str(err))
    elif "inline" in raw:
        data = dict(where.mapping(raw["inline"], f"{at}.inline"))
    return _merge(data, where.mapping(raw.get("override") or {}, f"{at}.override"))


# DRA objects a test's cluster may list inline, beside nodes and pods.
_DRA_LISTS = {
    "resourceSlices": DeviceIndex.set_slice,
    "resourceClaims": DeviceIndex.set_claim,
    "deviceClasses": DeviceIndex.set_device_class,
}


def _state(where: Reader, raw: Any, storm: StormBreakerConfig) -> ClusterState | None:
    """The test file's cluster; its Failed pods feed storm breakers with the file's settings."""
    if raw is None:
        return None
    raw = where.mapping(raw, "cluster", {"snapshots", "nodes", "pods", *_DRA_LISTS})
    paths = [
        _relative(where, p, "cluster.snapshots")
        for p in where.sequence(raw.get("snapshots", []), "cluster.snapshots")
    ]
    snapshots = [str(p) for p in paths if p is not None]
    state = ClusterState(StormBreakers.from_config(storm))
    try:
        state = load_snapshot(snapshots, storm) if snapshots else state
    except SnapshotError as err:
        where.fail("cluster.snapshots", "; ".join(err.problems))
    for kind in ("nodes", "pods", *_DRA_LISTS):
        for i, obj in enumerate(where.sequence(raw.get(kind, []), f"cluster.{kind}")):
            if not isinstance(obj, Mapping):
                where.fail(f"cluster.{kind}[{i}]", "must be a mapping")
                continue
            try:
                if kind == "nodes":
                    state.set_node(node_from(obj))
                elif kind == "pods":
                    state.storm.observe(obj, None)
                    state.set_pod(object_key(obj), pod_record(obj))
                else:
                    if state.devices is None:
                        state.devices = DeviceIndex()
                    _DRA_LISTS[kind](state.devices, obj)
            except FieldError as err:
                where.fail(f"cluster.{kind}[{i}]", str(err))
    return state


def _case(where: Reader, raw: Any, at: str, base_data: Mapping[str, Any], base: Config) -> Case | None:
    """One case; its problems are recorded in ``where`` (a case with any is never run)."""
    if not isinstance(raw, Mapping):
        where.fail(at, "must be a mapping")
        return None
    raw = where.mapping(raw, at, _CASE_KEYS)
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        where.fail(f"{at}.name", "must be a non-empty string")
        name = ""
    if not isinstance(raw.get("dryRun", False), bool):
        where.fail(f"{at}.dryRun", "must be true or false")  # accepted; verdicts never depend on it
    operation = raw.get("operation", "CREATE")
    if operation not in ("CREATE", "UPDATE"):
        where.fail(f"{at}.operation", "must be CREATE or UPDATE")
    expect = _expect(where, raw.get("expect"), f"{at}.expect")
    config = base
    if "config" in raw:
        data = _config_data(where, raw["config"], f"{at}.config", base_data)
        config = read_config(where.within(f"{at}.config"), data)
    return Case(
        name=name,
        obj=_object(where, raw, at, "object"),
        operation=operation,
        old_object=_object(where, raw, at, "oldObject")
        if ("oldObject" in raw or "oldObjectPath" in raw)
        else None,
        user=str(raw.get("user", "")),
        groups=where.strings(raw.get("groups", []), f"{at}.groups"),
        config=config,
        expect=expect,
        now=_moment(where, raw.get("now"), f"{at}.now"),
        bind_to=_bind_target(where, raw.get("bindTo"), f"{at}.bindTo"),
    )


def _expect(where: Reader, raw: Any, at: str) -> Mapping[str, Any]:
    expect = where.mapping(raw, at, _EXPECT_KEYS)
    if isinstance(raw, Mapping) and not expect:
        where.fail(at, "must state at least one expectation")
    if "allowed" in expect and not isinstance(expect["allowed"], bool):
        where.fail(f"{at}.allowed", "must be true or false")
    for key in ("reasons", "messages", "warnings"):
        value = expect.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            where.fail(f"{at}.{key}", "must be a list of strings")
    if "patched" in expect:
        where.mapping(expect["patched"], f"{at}.patched")
    if "patchedPath" in expect:
        expect = {**expect, "patched": _object(where, {"patchedPath": expect["patchedPath"]}, at, "patched")}
    return expect


def _bind_target(where: Reader, value: Any, at: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        where.fail(at, "must be a node name")
        return None
    return value


def _moment(where: Reader, value: Any, at: str) -> float:
    """``now: 2026-01-01T00:00:00Z`` pins the case's clock; by default it is the run's."""
    if value is None:
        return time.time()
    try:
        return rfc3339_seconds(str(value))
    except ValueError as err:
        where.fail(at, str(err))
        return time.time()


def _object(where: Reader, raw: Mapping[str, Any], at: str, key: str) -> dict[str, Any]:
    """An inline object, or the object in the file named by ``<key>Path``: its only one, or
    (``objectPath`` only) the one of its documents that ``document`` names, 1-based."""
    path_key = f"{key}Path"
    if key in raw:
        return dict(where.mapping(raw[key], f"{at}.{key}"))
    if path_key not in raw:
        where.fail(at, f"needs {key} or {path_key}")
        return {}
    path = _relative(where, raw[path_key], f"{at}.{path_key}")
    document = _document_number(where, raw, at) if key == "object" else None
    if path is None:
        return {}
    try:
        docs = list(documents_in(path.read_text(), str(path)))
    except OSError as err:
        where.fail(f"{at}.{path_key}", f"cannot read {path}: {err.strerror}")
        return {}
    errors = [d for d in docs if isinstance(d, ManifestError)]
    if errors:
        where.fail(f"{at}.{path_key}", str(errors[0]))
        return {}
    objects = [d.obj for d in docs if isinstance(d, Document)]
    if document is not None:
        chosen = [d.obj for d in docs if d.location.document == document and d.location.item is None]
        if len(chosen) != 1:
            where.fail(f"{at}.document", f"{path} has no object as document {document}")
            return {}
        return chosen[0]
    if len(objects) != 1:
        hint = f": name one with document: N (1 to {len(objects)})" if key == "object" else ""
        where.fail(f"{at}.{path_key}", f"{path} must hold exactly one object, it holds {len(objects)}{hint}")
        return {}
    return objects[0]


def _document_number(where: Reader, raw: Mapping[str, Any], at: str) -> int | None:
    """``document: N``, which object of a multi-document ``objectPath`` the case means."""
    if "document" not in raw:
        return None
    value = raw["document"]
    if "objectPath" not in raw:
        where.fail(f"{at}.document", "picks a document of objectPath; give objectPath too")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        where.fail(f"{at}.document", f"must be a document number, 1 or more (got {value!r})")
        return None
    return value


def _relative(where: Reader, value: Any, at: str) -> Path | None:
    """A path the test file names, relative to the test file."""
    if not isinstance(value, str):
        where.fail(at, "must be a path")
        return None
    return Path(where.source).parent / value


def select(cases: list[tuple[TestFile, Case]], pattern: str | None) -> list[tuple[TestFile, Case]]:
    if not pattern:
        return cases
    regex = re.compile(pattern)
    return [(f, c) for f, c in cases if regex.search(c.name)]


def write_junit(results: list[CaseResult], path: str) -> None:
    """JUnit XML, one testsuite per test file, for CI systems that render it."""
    from xml.etree import ElementTree as ET

    root = ET.Element("testsuites", tests=str(len(results)), failures=str(sum(not r.passed for r in results)))
    suites: dict[str, ET.Element] = {}
    for result in results:
        suite = suites.get(result.file)
        if suite is None:
            suite = suites[result.file] = ET.SubElement(root, "testsuite", name=result.file)
        case = ET.SubElement(suite, "testcase", classname=result.file, name=result.name)
        if result.failures:
            ET.SubElement(case, "failure", message=result.failures[0].splitlines()[0]).text = "\n".join(
                result.failures
            )
    for suite in suites.values():
        cases = suite.findall("testcase")
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


@dataclass(frozen=True, slots=True)
class SuiteRun:
    """The cases run, and the problems that kept test files (or any at all) from running."""

    results: tuple[CaseResult, ...]
    problems: tuple[str, ...]

    @property
    def failed(self) -> int:
        return sum(not r.passed for r in self.results)


def run_suite(paths: list[str], pattern: str | None = None) -> SuiteRun:
    """Every case under ``paths`` whose name matches ``pattern``. An invalid file is a problem
    and its cases do not run; so is finding no test file at all, which is never a pass."""
    files, problems = [], []
    for path in discover(paths):
        try:
            files.append(load_test_file(path))
        except TestFileError as err:
            problems.append(str(err))
    if not files and not problems:
        problems.append(f"no *{SUFFIX} files under {', '.join(paths)}")
    every = [(f, c) for f in files for c in f.cases]
    cases = select(every, pattern)
    if pattern and every and not cases:
        # A filter that selects nothing passes nothing: CI must not go green on a typo.
        problems.append(f"--run {pattern!r} selects none of the {len(every)} cases under {', '.join(paths)}")
    return SuiteRun(tuple(run_case(f, c) for f, c in cases), tuple(problems))
