"""Snapshot benchmark: ``admit-guard check --cluster`` on ``kubectl get nodes,pods -A -o json``
and ``-o yaml`` shaped Lists, side by side, at 1,000 nodes / 30,000 pods and 5,000 nodes /
150,000 pods (the JSON indented as kubectl writes it, the YAML in kubectl's block layout).

Runs the console script in a child process per load, so the numbers are what a CI job sees:
wall time, the child's CPU time (user + system: steadier than wall time on a shared machine)
and its peak RSS (``ru_maxrss``). Each format is loaded ``--rounds`` times, alternating; the
best round counts. Targets: issue 14, JSON at 5,000 nodes ≤ 8 s and ≤ 500 MB; issue 22, YAML
within 1.5x the JSON time and 2x its memory.
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
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.builders import cluster_node, cluster_pod  # noqa: E402

SIZES = ((1000, 30_000), (5000, 150_000))


def write_snapshot(path: Path, nodes: int, pods: int) -> None:
    rng = random.Random(1)
    items = [cluster_node(i) for i in range(nodes)] + [cluster_pod(i, nodes, rng) for i in range(pods)]
    document = {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}}
    if path.suffix == ".json":
        path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
        return
    # Through JSON first: shared dicts would become YAML anchors, which kubectl never writes.
    plain = orjson.loads(orjson.dumps(document))
    with path.open("w") as out:
        yaml.dump(plain, out, Dumper=yaml.CSafeDumper, default_flow_style=False, sort_keys=False)


def load(snapshot: Path) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS MB) of one ``check --cluster`` in a child process."""
    command = [
        str(Path(sys.executable).with_name("admit-guard")), "check", "--cluster", str(snapshot),
        "-f", str(ROOT / "examples/workloads"), "-o", "json",
    ]  # fmt: skip
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # wait4 gives this child's own usage (RUSAGE_CHILDREN would include the writer's).
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    errors = child.stderr.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        sys.exit(f"check failed on {snapshot}: {errors[-2000:]}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024 / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", help="write the snapshots in this directory and keep them")
    parser.add_argument("--only", type=int, help="only the size with this many nodes")
    parser.add_argument("--write-only", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_only:
        path, nodes, pods = args.write_only
        return write_snapshot(Path(path), int(nodes), int(pods))
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(args.keep or tmp)
        directory.mkdir(parents=True, exist_ok=True)
        for nodes, pods in SIZES:
            if args.only and nodes != args.only:
                continue
            best = {}
            for suffix in (".json", ".yaml"):
                snapshot = directory / f"cluster-{nodes}{suffix}"
                if not snapshot.exists():
                    # In a child of its own: a forked child's ru_maxrss counts the parent's pages.
                    writer = [sys.executable, __file__, "--write-only", str(snapshot), str(nodes), str(pods)]
                    subprocess.run(writer, check=True)
            runs: dict[str, list[tuple[float, float, float]]] = {".json": [], ".yaml": []}
            for _ in range(args.rounds):
                for suffix in runs:
                    runs[suffix].append(load(directory / f"cluster-{nodes}{suffix}"))
            for suffix, results in runs.items():
                size = (directory / f"cluster-{nodes}{suffix}").stat().st_size / 1e6
                wall = min(r[0] for r in results)
                cpu = min(r[1] for r in results)
                rss = max(r[2] for r in results)
                best[suffix] = (wall, cpu, rss)
                print(
                    f"{nodes} nodes, {pods} pods, {suffix[1:]:4} {size:5.0f} MB: "
                    f"{wall:5.2f} s wall, {cpu:5.2f} s CPU, peak RSS {rss:4.0f} MB"
                )
            (jw, jc, jr), (yw, yc, yr) = best[".json"], best[".yaml"]
            ok = yc <= 1.5 * jc and yr <= 2 * jr
            failed |= not ok
            print(
                f"  YAML/JSON: {yw / jw:.2f}x wall, {yc / jc:.2f}x CPU, {yr / jr:.2f}x memory "
                f"(targets: <= 1.5x time, <= 2x memory) {'ok' if ok else 'MISSED'}"
            )
            if nodes == 5000:
                print(f"  JSON at 5,000 nodes: {jw:.2f} s, {jr:.0f} MB (targets: <= 8 s, <= 500 MB)")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
