"""Every real-world manifest in the shared corpus gets a verdict or a clear input error."""

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.helpers.paths import EXAMPLES, ROOT
from webhook.cli import main

CORPUS = ROOT.parent / "shared" / "corpus" / "manifests"
CLUSTER = EXAMPLES / "cluster"


@pytest.mark.skipif(not CORPUS.is_dir(), reason="shared/corpus is not beside the checkout")
def test_every_corpus_file_gets_a_verdict_or_an_input_error():
    files = sorted(CORPUS.rglob("*.yaml"))
    assert len(files) >= 1000
    exit_codes = {0: 0, 1: 0, 2: 0}
    unreadable = duplicates = 0
    for path in files:
        result = CliRunner().invoke(main, ["check", "-f", str(path), "--cluster", str(CLUSTER), "-o", "json"])
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            f"{path}: {result.exception!r}"
        )
        assert result.exit_code in exit_codes, f"{path}: exit {result.exit_code}"
        if result.exit_code == 2:
            assert str(path) in result.stdout + result.stderr
            duplicates += "duplicate key" in result.stdout + result.stderr
        if not _parses(path):
            unreadable += 1
            assert result.exit_code == 2, f"{path} is neither YAML nor JSON but was not an input error"
        exit_codes[result.exit_code] += 1
    # Twelve files fail PyYAML's pure-Python loader on purpose; libyaml (like kubectl's go-yaml) reads four.
    assert unreadable == 8
    # Strict decoding, as kubectl's: these repeat a mapping key, and used to pass with the last value.
    assert duplicates == 12
    assert exit_codes[1] > 0 and exit_codes[0] > 0


def _parses(path: Path) -> bool:
    text = path.read_text()
    try:
        list(yaml.load_all(text, Loader=yaml.CSafeLoader))  # libyaml, like kubectl's go-yaml
        return True
    except yaml.YAMLError:
        pass
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


@pytest.mark.skipif(not CORPUS.is_dir(), reason="shared/corpus is not beside the checkout")
def test_every_operator_workload_in_the_corpus_gets_a_verdict():
    """Volcano, JobSet, Kubeflow, KubeRay, LeaderWorkerSet and Trainer documents are judged,
    never skipped: a verdict, or an input error at that document (a template variable where a
    quantity belongs, a repeated key)."""
    from webhook.kube.workloads import BUILT_IN

    expected: dict[tuple[str, int], str] = {}
    for path in sorted(CORPUS.rglob("*.yaml")):
        try:
            documents = list(yaml.load_all(path.read_text(), Loader=yaml.CSafeLoader))
        except yaml.YAMLError:
            continue
        for number, doc in enumerate(documents, 1):
            if isinstance(doc, dict) and BUILT_IN.kind_of(doc) is not None:
                expected[(str(path), number)] = doc["kind"]
    assert len(expected) >= 150
    files = sorted({file for file, _ in expected})
    result = CliRunner().invoke(
        main, ["check", *(a for f in files for a in ("-f", f)), "--cluster", str(CLUSTER), "-o", "json"]
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    report = json.loads(result.stdout)
    judged = {(r["file"], r["document"]): r for r in report["results"]}
    errors = {(e["file"], e["document"]) for e in report["errors"]}
    for key, kind in expected.items():
        assert key in errors or (key in judged and not judged[key]["skipped"]), (key, kind)
    verdicts = [judged[k] for k in expected if k in judged]
    assert len(verdicts) >= len(expected) - 2  # two are input errors
    assert any(not r["allowed"] for r in verdicts) and any(r["allowed"] for r in verdicts)
