"""Snapshot benchmark: ``admit-guard check --cluster`` on a ``kubectl get nodes,pods -A -o json``
shaped List (indented) of 5,000 nodes / 150,000 pods: about 106 MB.

Runs the console script in a child process, so the numbers are what a CI job sees: wall time
and the child's peak RSS (``ru_maxrss``). Target (issue 14): peak ≤ 500 MB and ≤ 8 s.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.builders import cluster_node, cluster_pod  # noqa: E402


def write_snapshot(path: Path, nodes: int, pods: int) -> None:
    rng = random.Random(1)
    items = [cluster_node(i) for i in range(nodes)] + [cluster_pod(i, nodes, rng) for i in range(pods)]
    document = {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}}
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--keep", help="write the snapshot here and keep it")
    parser.add_argument("--write-only", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_only:
        return write_snapshot(Path(args.write_only), args.nodes, args.pods)
    with tempfile.TemporaryDirectory() as tmp:
        snapshot = Path(args.keep or Path(tmp) / "cluster.json")
        if not snapshot.exists():
            # In a child of its own: a forked child's ru_maxrss counts the parent's pages.
            writer = [sys.executable, __file__, "--nodes", str(args.nodes), "--pods", str(args.pods)]
            subprocess.run([*writer, "--write-only", str(snapshot)], check=True)
        size_mb = snapshot.stat().st_size / 1e6
        command = [
            str(Path(sys.executable).with_name("admit-guard")), "check", "--cluster", str(snapshot),
            "-f", str(ROOT / "examples/workloads"), "-o", "json",
        ]  # fmt: skip
        started = time.perf_counter()
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # wait4 gives this child's own peak RSS (RUSAGE_CHILDREN would include the writer's).
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        returncode = os.waitstatus_to_exitcode(status)
        errors = child.stderr.read().decode(errors="replace")
        peak_mb = usage.ru_maxrss * 1024 / 1e6
    if returncode not in (0, 1):
        sys.exit(f"check failed ({returncode}): {errors[-2000:]}")
    print(f"snapshot: {args.nodes} nodes, {args.pods} pods, {size_mb:.0f} MB JSON")
    print(f"check --cluster: {seconds:5.2f} s, peak RSS {peak_mb:.0f} MB (targets: <= 8 s, <= 500 MB)")


if __name__ == "__main__":
    main()
