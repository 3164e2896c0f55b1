"""The command line loads what a command delegates to only when that command runs: ``--help``
costs no more than click, and a dry run in CI never pays for the server or the API client."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.paths import EXAMPLES

ENV = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
SERVER_AND_CLIENT = ("flask", "werkzeug", "gunicorn", "kubernetes", "prometheus_client", "cryptography")


def modules_after(*args: str) -> set[str]:
    """The modules loaded once ``admit-guard ARGS`` has run, in a fresh interpreter."""
    script = (
        "import sys\n"
        "from webhook.cli import main\n"
        "try:\n"
        "    main(sys.argv[1:], prog_name='admit-guard')\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.__stderr__.write('\\nloaded:' + ' '.join(sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, env=ENV, timeout=60
    )
    names = done.stderr.rpartition("\nloaded:")[2].split()
    return {name if name.startswith("webhook") else name.partition(".")[0] for name in names}


def test_help_loads_neither_the_engine_nor_any_parser():
    loaded = modules_after("--help")
    assert "webhook.cli.check" in loaded  # every command is listed...
    assert not loaded & {"webhook.engine", "webhook.config", "webhook.policytest", "yaml", "orjson"}
    assert not loaded & set(SERVER_AND_CLIENT)


def test_check_loads_neither_the_server_nor_the_other_commands_faces():
    loaded = modules_after("check", "-f", str(EXAMPLES / "workloads"), "--cluster", str(EXAMPLES / "cluster"))
    assert "webhook.engine" in loaded
    assert not loaded & set(SERVER_AND_CLIENT)
    assert not loaded & {"webhook.policytest", "webhook.audit", "webhook.serve.app", "webhook.serve.gunicorn"}
