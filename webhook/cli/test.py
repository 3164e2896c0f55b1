"""``admit-guard test``: policy test files through the engine, as unit tests for a config."""

from __future__ import annotations

import sys

import click

from .options import EXIT_DENIED, EXIT_INPUT_ERROR


@click.command("test")
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
def test(paths, pattern, junit, junit_file) -> None:
    """Run policy test files (*.test.yaml under directories) through the engine.

    Exit status: 0 all passed, 1 any failed, 2 invalid test files.
    """
    from ..policytest import run_suite, write_junit
    from . import render

    run = run_suite(list(paths), pattern)
    render.policy_tests(run)
    for target in {junit[1] if junit else None, junit_file} - {None}:
        write_junit(list(run.results), target)
    if run.problems:
        sys.exit(EXIT_INPUT_ERROR)
    if run.failed:
        sys.exit(EXIT_DENIED)
