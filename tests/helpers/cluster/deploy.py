"""The guard as ``deploy/`` ships it: the self-signed overlay rendered with ``kubectl kustomize``
from a copy of ``deploy/`` with fresh certificates, as ``make deploy-certs deploy-render`` does.

The webhook configurations come from here, and so do the guard's TLS files and its config
(the ConfigMap), so the box runs what a cluster would be given.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.paths import ROOT
from webhook.certs import issue

OVERLAY = Path("overlays") / "self-signed"


@dataclass
class Rendered:
    docs: list[dict[str, Any]]
    cert_dir: Path  # ca.crt, tls.crt, tls.key: the Secret the Deployment mounts

    def webhook_configurations(self) -> list[dict[str, Any]]:
        kinds = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
        return [d for d in self.docs if d["kind"] in kinds]

    def config(self) -> dict[str, Any]:
        """The guard's config.yaml, from the ConfigMap the Deployment mounts."""
        for doc in self.docs:
            if doc["kind"] == "ConfigMap" and "config.yaml" in (doc.get("data") or {}):
                return yaml.safe_load(doc["data"]["config.yaml"])
        raise LookupError("no ConfigMap with config.yaml in the rendered overlay")


def kubectl() -> str | None:
    return shutil.which("kubectl")


def render(workdir: Path) -> Rendered:
    """Render the self-signed overlay; needs ``kubectl`` (kustomize is built in)."""
    copy = workdir / "deploy"
    shutil.copytree(ROOT / "deploy", copy, ignore=shutil.ignore_patterns("certs"))
    certs = copy / OVERLAY / "certs"
    issue("admit-guard", "admit-guard", certs)
    text = subprocess.run(
        [kubectl() or "kubectl", "kustomize", str(copy / OVERLAY)], check=True, capture_output=True, text=True
    ).stdout
    return Rendered([doc for doc in yaml.safe_load_all(text) if doc], certs)
