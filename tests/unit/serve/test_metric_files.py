"""A full metrics filesystem stops the metrics, not the worker.

prometheus_client maps its multi-process files sparse; on a full filesystem the first store into
a page without a block killed the worker with SIGBUS (``webhook/serve/metric_files.py``). Measured on
a real full filesystem: a 1 MiB tmpfs, which needs root to mount.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

# A worker's metrics: a few of each kind, then enough label sets that the counter file must
# grow past its first 64 KiB; then a scrape, as a worker answers /metrics.
WORKER = """
from webhook.serve.metrics import Metrics
metrics = Metrics()
for i in range(600):
    metrics.count_request("validate", "Pod", "CREATE", f"verdict-{i}", 0.001)
    metrics.count_bad_request("validate", 400 + i)
text = metrics.scrape().decode()
degraded = [line for line in text.splitlines() if line.startswith("admit_guard_metric_files_degraded ")]
print("scraped", degraded[0])
"""


@pytest.fixture
def small_tmpfs(tmp_path):
    mount = tmp_path / "metrics"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(
            f"needs a 1 MiB tmpfs to fill, and mounting one failed (root required): {done.stderr.strip()}"
        )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(directory: Path, leave: int) -> None:
    """Fill the filesystem, then free ``leave`` bytes of it."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, bytes(4096)):
            pass
    except OSError:
        pass  # ENOSPC: full
    finally:
        os.close(fd)
    os.truncate(filler, max(0, filler.stat().st_size - leave))


@pytest.mark.parametrize("room", [0, 100 * 1024], ids=["full", "room-for-one-file"])
def test_a_full_metrics_filesystem_degrades_the_metrics_not_the_worker(small_tmpfs, room):
    _fill(small_tmpfs, room)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(small_tmpfs)}
    done = subprocess.run(
        [sys.executable, "-c", WORKER], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != -signal.SIGBUS, "killed by SIGBUS"
    assert done.returncode == 0, done.stderr
    count = int(done.stdout.split("admit_guard_metric_files_degraded ")[1].split(".")[0])
    assert count >= 1
    assert "cannot grow" in done.stderr  # one warning per stuck file
