"""Incidents benchmark (issue 28): the cluster in a box, each scenario with the guard and
without it (no webhooks), same seed; a table of what the guard changes.

    python bench/incidents_bench.py [--scenario NAME ...] [--seed N] [--scale small|full]
                                    [--lag-ms N] [--json]

``--lag-ms``: how far each scheduler's cache lags the API server. ``--json`` prints a list of
objects, one per scenario and arm, with the keys of ``Outcome.row`` (the contract of issue 28).
Everything runs on loopback: the API double, the guard's replicas, the cluster's components;
each run is bounded in time (``--scale``) and in pods (``box.POD_LIMIT``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.cluster import deploy  # noqa: E402
from tests.helpers.cluster.scenarios import ARMS, SCALES, SCENARIOS, run  # noqa: E402

COLUMNS = (
    ("scenario", 15), ("arm", 6), ("failed_per_minute", 9), ("unexpected_admission_errors", 6),
    ("devices_twice", 6), ("wanted_pods", 7), ("running_pods", 8), ("seconds_to_running", 8),
    ("binds_denied", 7), ("binds_retried", 8), ("webhook_p50_ms", 8), ("webhook_p99_ms", 8),
    ("api_writes_per_pod", 8),
)  # fmt: skip
HEADERS = {
    "failed_per_minute": "fail/min", "unexpected_admission_errors": "UAE", "devices_twice": "twice",
    "wanted_pods": "wanted", "running_pods": "running", "seconds_to_running": "t_run s",
    "binds_denied": "denied", "binds_retried": "retried", "webhook_p50_ms": "p50 ms",
    "webhook_p99_ms": "p99 ms", "api_writes_per_pod": "wr/pod",
}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scenario", action="append", choices=sorted(SCENARIOS), help="repeatable; default all"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scale", choices=sorted(SCALES), default="small")
    parser.add_argument("--lag-ms", type=float, default=1000.0, help="scheduler cache lag (default 1000)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if deploy.kubectl() is None:
        print("incidents_bench: kubectl is needed to render deploy/ (kustomize)", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="incidents-") as tmp:
        rendered = deploy.render(Path(tmp))
        if not args.json:
            print(_header(), flush=True)
        for name in args.scenario or list(SCENARIOS):
            for arm in ARMS:
                outcome = run(
                    name, arm, seed=args.seed, scale=args.scale, lag_ms=args.lag_ms, rendered=rendered
                )
                rows.append(outcome.row())
                if not args.json:
                    print(_line(rows[-1]), flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        machine = f"{platform.machine()}, {platform.system()} {platform.release()}, {os.cpu_count()} cpus"
        print(f"\n{machine}, Python {platform.python_version()}, scale {args.scale}, seed {args.seed}, "
              f"scheduler cache lag {args.lag_ms:.0f} ms")  # fmt: skip
    return 0


def _header() -> str:
    return " ".join(HEADERS.get(k, k).rjust(w) if i > 1 else k.ljust(w) for i, (k, w) in enumerate(COLUMNS))


def _line(row: dict) -> str:
    cells = []
    for i, (key, width) in enumerate(COLUMNS):
        value = "-" if row[key] is None else str(row[key])
        cells.append(value.ljust(width) if i < 2 else value.rjust(width))
    return " ".join(cells)


if __name__ == "__main__":
    sys.exit(main())
