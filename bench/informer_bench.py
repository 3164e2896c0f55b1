"""Informer benchmark: a synthetic 5,000-node / 150,000-pod cluster served by the test API
server (a separate process on loopback), listed in pages of 500 and then watched.

Reports time to ready (both lists done), RSS of this process after sync, and watch events
applied per second (200,000 pod updates recorded after the list, replayed by the watch).
Targets (issue 14, from 6.17 s / 132 MiB / 24,671 events/s): ready <= 6 s, RSS after sync
<= 132 MiB, >= 50,000 events/s applied.

Then a relist from a server that ignores ``limit`` and sends all pods in one response: the
peak RSS above the state it replaces (issue 21: a 150 MiB list peaked at 870 MiB).

Then a list of pods as a live API server lists them (``--live-pods``, default 30,000 pods of
~11 KB: managed fields, env, probes, statuses), with pages decoded typed (the informer's way,
``state/listed_pods.py``) and, in the same run, parsed whole into dicts (the way before it):
CPU per pod of each, and their ratio.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.fake_apiserver import Cluster, write_kubeconfig  # noqa: E402
from webhook.state import informer as informer_module  # noqa: E402
from webhook.state import model  # noqa: E402
from webhook.state.apiserver import ApiServer  # noqa: E402
from webhook.state.informer import Informer, Timing  # noqa: E402


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def serve(args, *extra: str) -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.fake_apiserver", "--nodes", str(args.nodes),
         "--pods", str(args.pods), "--events", str(args.events), *extra],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    return server, server.stdout.readline().strip()


def stop(server: subprocess.Popen) -> None:
    server.stdin.close()
    server.wait(timeout=30)


def relist_in_one_response(args, tmp: str) -> None:
    """List the cluster once, then again (a relist) from a server that ignores ``limit``."""
    server, url = serve(argparse.Namespace(**{**vars(args), "events": 0}), "--ignore-limit")
    try:
        path = write_kubeconfig(Path(tmp) / "kubeconfig-whole", url, Cluster().token)
        informer = Informer(ApiServer.connect(kubeconfig=path), Timing(page_size=500))
        informer.list_once()
        gc.collect()
        before = rss_mib()
        try:
            Path("/proc/self/clear_refs").write_text("5")  # the peak RSS starts again from here
        except OSError:
            print("(cannot reset the peak RSS: the figure below includes everything before)")
        started = time.perf_counter()
        informer.list_once()
        took = time.perf_counter() - started
        print(
            f"relist, all {len(informer.state.pods)} pods in one response: {took:.2f} s, "
            f"peak RSS {peak_rss_mib() - before:+.0f} MiB over the {before:.0f} MiB before it"
        )
    finally:
        stop(server)


def live_pods_list(args, tmp: str) -> None:
    """One list of live-shaped pods decoded typed, then one parsed whole: CPU per pod."""
    shaped = argparse.Namespace(nodes=max(args.live_pods // 20, 1), pods=args.live_pods, events=0)
    server, url = serve(shaped, "--live-pods")
    try:
        path = write_kubeconfig(Path(tmp) / "kubeconfig-live", url, Cluster().token)
        typed_decode = informer_module.pod_page
        took = {}
        for way, decode in (("typed", typed_decode), ("parsed whole", lambda body, storm: None)):
            informer_module.pod_page = decode
            model._shared.clear()
            informer = Informer(ApiServer.connect(kubeconfig=path), Timing(page_size=500))
            started = time.process_time()
            informer.list_once()
            took[way] = (time.process_time() - started) / max(len(informer.state.pods), 1)
            del informer
            gc.collect()
        informer_module.pod_page = typed_decode
        print(
            f"list of {args.live_pods} live-shaped pods (~11 KB each), CPU per pod: typed "
            f"{took['typed'] * 1e6:.1f} us, parsed whole {took['parsed whole'] * 1e6:.1f} us "
            f"({took['parsed whole'] / took['typed']:.1f}x)"
        )
    finally:
        stop(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--live-pods", type=int, default=30_000, help="pods in the live-shaped list")
    args = parser.parse_args()
    server, url = serve(args)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = write_kubeconfig(Path(tmp) / "kubeconfig", url, Cluster().token)
            baseline = rss_mib()
            started = time.perf_counter()
            informer = Informer(ApiServer.connect(kubeconfig=path), Timing(page_size=500)).start()
            informer.wait_synced(300)
            ready = time.perf_counter() - started
            synced_rss = rss_mib()
            events_from, cpu_from = time.perf_counter(), time.process_time()
            while informer.events < args.events and time.perf_counter() - events_from < 300:
                time.sleep(0.01)
            applied = time.perf_counter() - events_from
            cpu = time.process_time() - cpu_from
            informer.stop()
        print(f"cluster: {args.nodes} nodes, {args.pods} pods; {len(informer.state.pods)} pods in state")
        print(f"time to ready (both lists, pages of 500): {ready:5.2f} s (target <= 6 s)")
        print(f"RSS after sync: {synced_rss:.0f} MiB (before start: {baseline:.0f} MiB; target <= 132 MiB)")
        print(
            f"watch: {informer.events} events in {applied:.2f} s = {informer.events / applied:,.0f} events/s"
            " (target >= 50,000)"
        )
        # The fake API server shares the two cores: the informer's own CPU per event is its capacity.
        per_event = cpu / max(informer.events, 1)
        print(f"informer CPU: {per_event * 1e6:.1f} us/event = {1 / per_event:,.0f} events/s per core")
    finally:
        stop(server)
    del informer
    with tempfile.TemporaryDirectory() as tmp:
        relist_in_one_response(args, tmp)
        live_pods_list(args, tmp)


if __name__ == "__main__":
    main()
