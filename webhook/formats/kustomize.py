"""``-k DIR``: a kustomization rendered by ``kubectl kustomize``, as ``kubectl apply -k`` would.

kubectl carries kustomize built in, so the objects checked are the ones kubectl would apply.
"""

from __future__ import annotations

import shutil
import subprocess

TIMEOUT = 120  # seconds: remote bases are fetched, but a hung render must not hang CI


class KustomizeError(Exception):
    """The kustomization could not be rendered; the message says why and what to do."""


def render(directory: str) -> str:
    """The YAML stream ``kubectl kustomize DIRECTORY`` prints."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise KustomizeError(
            "-k needs kubectl on PATH (it renders kustomizations with 'kubectl kustomize'): "
            f"install kubectl, or render it yourself: 'kustomize build {directory} | admit-guard check -f -'"
        )
    try:
        done = subprocess.run(
            [kubectl, "kustomize", directory],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise KustomizeError(f"'kubectl kustomize {directory}' did not finish in {TIMEOUT} s") from None
    except OSError as err:
        raise KustomizeError(f"cannot run kubectl: {err.strerror or err}") from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        detail = lines[-1] if lines else f"exit status {done.returncode}"
        raise KustomizeError(f"'kubectl kustomize {directory}' failed: {detail}")
    return done.stdout
