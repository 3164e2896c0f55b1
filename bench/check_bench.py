"""`admit-guard check` on 40,000 Deployments in one ~20 MB YAML file (issue 13).

Measures, in one run: the YAML parse alone (libyaml through the strict loader the CLI uses,
with the collector paused as the CLI pauses it), then the whole command (parse, checks against
the example cluster, JSON output) in-process. "The rest" is the whole minus the parse.
Target: the rest <= 30% of the parse.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "examples" / "cluster"
sys.path.insert(0, str(ROOT))

from webhook.cli import main as cli  # noqa: E402
from webhook.formats.manifests import StrictLoader  # noqa: E402
from webhook.state.gc_pause import collector_paused  # noqa: E402

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web-{n}
  namespace: team-{team}
  labels: {{app: web-{n}, team: team-{team}}}
spec:
  replicas: 3
  selector:
    matchLabels: {{app: web-{n}}}
  template:
    metadata:
      labels: {{app: web-{n}}}
    spec:
      containers:
        - name: app
          image: registry.example/web:{n}
          ports: [{{containerPort: 8080}}]
          resources:
            requests: {{cpu: 250m, memory: 256Mi}}
            limits: {{memory: 512Mi}}
        - name: sidecar
          image: registry.example/proxy:1.2
          resources:
            requests: {{cpu: 50m, memory: 64Mi}}
      tolerations:
        - {{key: dedicated, operator: Equal, value: web, effect: NoSchedule}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=40_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "deployments.yaml"
        path.write_text("---\n".join(DEPLOYMENT.format(n=n, team=n % 50) for n in range(args.objects)))
        size = path.stat().st_size / 1e6
        parses, totals = [], []
        for _ in range(args.runs):
            started = time.perf_counter()
            with collector_paused():
                count = sum(1 for _ in yaml.load_all(path.read_text(), Loader=StrictLoader))
            parses.append(time.perf_counter() - started)
            started = time.perf_counter()
            command = ["check", "-f", str(path), "--cluster", str(CLUSTER), "-o", "json"]
            quiet = contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO())
            with quiet[0], quiet[1], contextlib.suppress(SystemExit):
                cli(command)
            totals.append(time.perf_counter() - started)
    parse, total = statistics.median(parses), statistics.median(totals)
    print(f"{count} Deployments, {size:.1f} MB YAML; median of {args.runs} runs")
    print(f"parse alone: {parse:6.2f} s   whole check: {total:6.2f} s   rest: {total - parse:6.2f} s")
    print(f"rest / parse = {(total - parse) / parse:.0%} (target <= 30%)")


if __name__ == "__main__":
    main()
