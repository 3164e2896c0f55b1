"""The import arrows of docs/architecture.md point down, and nothing below the engine serves HTTP.

``kube/`` holds Kubernetes semantics, ``checks/`` the kubelet's admission checks, ``dra/`` the
DRA allocator's judge, ``scheduler/`` kube-scheduler's filters and placement, ``policies/`` the
policies: pure code that the CLI, the server and the policy tests share. None of it may
import the HTTP stack, gunicorn, the kubernetes client, or a module above it; imports used
only by type checkers (under ``if TYPE_CHECKING:``) are not edges at run time and are skipped.
``serve/`` (the request's path) is a way in: only the CLI imports it. The leaves import no
project module but another leaf.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

PACKAGE = ROOT / "webhook"
FOREIGN = ("flask", "werkzeug", "gunicorn", "kubernetes", "click", "prometheus_client")
# What each package may import from the project, besides the standard library and its own package.
ALLOWED = {
    "kube": (),
    "checks": ("webhook.kube", "webhook.state"),
    "dra": ("webhook.kube", "webhook.state"),
    "scheduler": ("webhook.checks", "webhook.kube", "webhook.state"),
    "policies": (
        "webhook.scheduler",
        "webhook.checks",
        "webhook.dra",
        "webhook.kube",
        "webhook.state",
        "webhook.formats",
        "webhook.globs",
    ),
}
# The leaves: the file and wire formats (one package) and the glob patterns.
LEAVES = ("webhook.formats", "webhook.globs")


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in ``path`` that runs."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child.test):
                continue
            if isinstance(child, ast.Import):
                found.extend((child.lineno, alias.name) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                found.append((child.lineno, _absolute(child, package)))
            visit(child)

    visit(tree)
    return found


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _files(name: str) -> list[Path]:
    return sorted((PACKAGE / name).rglob("*.py"))


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_pure_packages_import_neither_the_http_stack_nor_the_modules_above_them(name):
    allowed = (f"webhook.{name}", *ALLOWED[name])
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {module}"
        for path in _files(name)
        for line, module in imports(path)
        if module.split(".")[0] in FOREIGN
        or (
            module.split(".")[0] == "webhook"
            and not any(module == a or module.startswith(f"{a}.") for a in allowed)
        )
    ]
    assert offenders == []


def test_only_the_cli_imports_the_serving_package():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {module}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in ("serve", "cli")
        for line, module in imports(path)
        if module == "webhook.serve" or module.startswith("webhook.serve.")
    ]
    assert offenders == []


def _leaf(module: str) -> bool:
    return any(module == leaf or module.startswith(f"{leaf}.") for leaf in LEAVES)


@pytest.mark.parametrize("path", [*_files("formats"), PACKAGE / "globs.py"], ids=lambda p: p.name)
def test_leaves_import_no_project_module_but_a_leaf(path):
    offenders = [
        f"{path.name}:{line}: {module}"
        for line, module in imports(path)
        if module.split(".")[0] in (*FOREIGN, "webhook") and not _leaf(module)
    ]
    assert offenders == []
