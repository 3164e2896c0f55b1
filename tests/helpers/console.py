"""The installed console script in a subprocess, and the manifests its tests write."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import EXAMPLES, ROOT

CLUSTER = str(EXAMPLES / "cluster")
WORKLOADS = str(EXAMPLES / "workloads")
PINNED = str(EXAMPLES / "workloads" / "incident-1-pinned-deployment.yaml")
GOOD = str(EXAMPLES / "workloads" / "good-deployment.yaml")
SCRIPT = Path(sys.executable).parent / "admit-guard"
# A test's cluster is the one it names: never the machine's kubeconfig.
ENV = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}

NODE = "apiVersion: v1\nkind: Node\nmetadata: {name: gpu-1}\nstatus: {allocatable: {cpu: '8', pods: '110'}}\n"

STORM_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: t-{i}
  namespace: ml
  uid: u{i}
  creationTimestamp: "2026-01-01T10:00:{i:02d}Z"
  labels: {{app: t}}
  ownerReferences: [{{apiVersion: apps/v1, kind: ReplicaSet, name: t, uid: rs-1, controller: true}}]
spec: {{nodeName: gpu-1, containers: [{{name: t, image: t}}]}}
status: {{phase: Failed, reason: OutOfcpu, message: "Pod was rejected: Node didn't have enough resource"}}
"""

NEXT_POD = STORM_POD.format(i=99).replace("creationTimestamp", "x-unused").split("status:")[0]


def cli(*args: str, stdin: str | int | None = "", cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``admit-guard ARGS``; stdin is a pipe (text) or a file descriptor, never a terminal."""
    pipe = stdin if isinstance(stdin, str) else None
    return subprocess.run(
        [str(SCRIPT), *args],
        input=pipe,
        stdin=None if pipe is not None else stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=ENV,
        timeout=30,
        check=False,
    )


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def on_a_terminal(*args: str, stream: str = "stdout", columns: int = 80) -> str:
    """What ``admit-guard ARGS`` writes to ``stream`` ("stdout" or "stderr") when that stream is a
    pseudo-terminal ``columns`` wide (the other goes nowhere)."""
    leader, follower = pty.openpty()
    streams = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, stream: follower}
    env = {**ENV, "COLUMNS": str(columns)}
    child = subprocess.Popen([str(SCRIPT), *args], **streams, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed with the child
            break
        if not chunk:
            break
        chunks.append(chunk)
    child.wait(timeout=30)
    os.close(leader)
    return b"".join(chunks).decode().replace("\r\n", "\n")
