"""An open-loop review sender for the benchmarks: latency from the scheduled send time, so a
slow answer delays every later one's measurement instead of hiding behind them."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

from tests.helpers.live_server import post_json


def send(
    server, total: int, rate: float, connections: int, body: Callable[[int], bytes | dict], *, allowed=None
) -> tuple[list[float], int, int]:
    """Send ``body(i)`` for i < ``total`` at ``rate``/s over keep-alive ``connections`` to
    /validate: (latencies, allowed, errors). ``allowed(response)`` says what counts as allowed."""
    counted = allowed or (lambda response: response["allowed"])
    latencies: list[float] = []
    counts = {"allowed": 0, "errors": 0}
    lock = threading.Lock()
    start = time.perf_counter() + 0.5

    def worker(offset: int) -> None:
        conn = server.connect()
        for i in range(offset, total, connections):
            payload = body(i)
            scheduled = start + i / rate
            time.sleep(max(0.0, scheduled - time.perf_counter()))
            try:
                status, answer = post_json(conn, "/validate", payload)
                ok = status == 200
                yes = ok and counted(answer["response"])
            except OSError:
                ok = yes = False
                conn.close()
                conn = server.connect()
            with lock:
                latencies.append(time.perf_counter() - scheduled)
                counts["allowed"] += yes
                counts["errors"] += not ok
        conn.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, counts["allowed"], counts["errors"]


def report(label: str, what: str, latencies: list[float], allowed: int, errors: int) -> str:
    latencies.sort()
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[int(len(latencies) * 0.99) - 1] * 1000
    return (
        f"{label:32} {len(latencies)} {what}: p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  "
        f"allowed {allowed}  errors {errors}"
    )
