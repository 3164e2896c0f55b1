"""Where the repository's files are, for tests at any depth of the tree."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
EXAMPLES = ROOT / "examples"
FIXTURES = TESTS / "fixtures"  # manifests shaped like each project's own examples, and schemas
