"""The README and docs/ as a new user reads them: every link, anchor, cited spec and named
section leads somewhere, and the commands they show run as shown (issue 29's smaller things)."""

from __future__ import annotations

import re
import shlex

import pytest

from tests.helpers.console import cli
from tests.helpers.paths import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
SECTION = re.compile(r'(?:see|under)\s+"([^"]+)"')
SPEC = re.compile(r"\b([a-z]+(?:-[a-z]+)*-spec)\b")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(path) -> list[str]:
    in_code = False
    found = []
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.append(line.lstrip("#").strip())
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_anchor_leads_somewhere(doc):
    for target in LINK.findall(doc.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path) if path else doc
        assert linked.exists(), f"{doc.name}: {target}"
        if anchor:
            assert anchor in {slug(h) for h in headings(linked)}, f"{doc.name}: {target}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_section_named_in_quotes_exists(doc):
    titles = {h.strip("`") for h in headings(doc)} | {h for h in headings(ROOT / "README.md")}
    for quoted in SECTION.findall(doc.read_text()):
        name = " ".join(quoted.split())
        assert any(t.startswith(name) for t in titles), f"{doc.name}: section {name!r}"


def test_every_spec_the_project_cites_is_in_docs():
    cited = set()
    for path in [*DOCS, *(ROOT / "webhook").rglob("*.py")]:
        cited |= set(SPEC.findall(path.read_text()))
    missing = sorted(name for name in cited if not (ROOT / "docs" / f"{name}.md").exists())
    assert not missing


def test_the_readme_says_how_admit_guard_gets_on_path():
    text = (ROOT / "README.md").read_text()
    assert ".venv/bin/admit-guard" in text and "pip install ." in text


def test_the_readme_shows_the_two_commands_and_ci_runs_the_test_one():
    text = (ROOT / "README.md").read_text()
    assert "make run" in text and "make test" in text
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith("make test")


def test_the_readme_is_a_landing_page():
    """Everything but the landing page lives in docs/ (issue 26 item 6)."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_the_readmes_certs_example_works_right_after_make_run(tmp_path):
    """``make run`` leaves a CA in certs/ (``admit-guard certs --out certs``); the server's page
    and the README show the same ``--renew`` call."""
    assert cli("certs", "--out", "certs", cwd=tmp_path).returncode == 0
    serve = (ROOT / "docs" / "serving.md").read_text()
    [line] = [line for line in serve.splitlines() if line.startswith("admit-guard certs")][:1]
    assert line.split("#", 1)[0].strip() in (ROOT / "README.md").read_text()
    args = shlex.split(line.split("#", 1)[0])[1:]
    result = cli(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
