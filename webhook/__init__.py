"""admit-guard: a Kubernetes admission guard that refuses what the kubelet would refuse.

Kubernetes semantics follow upstream Kubernetes v1.35 (kubelet admission as re-specified in
docs/kubelet-admission-spec.md); see docs/ for the rules and docs/architecture.md for the
request's path through the packages.

The public API, for embedding the guard or checking objects from Python::

    from webhook import evaluate, load_config, load_snapshot

    decision = evaluate(obj, "CREATE", load_snapshot(["cluster.yaml"]), load_config("guard.yaml"))

Names are imported on first use: ``import webhook`` stays cheap for the CLI, and only
``create_app`` brings in Flask.
"""

from __future__ import annotations

import sys
from importlib import import_module

KUBERNETES_VERSION = "v1.35"
TYPE_CHECKING = False  # ``typing`` alone would double the cost of ``import webhook``

# Public name -> the module that defines it.
_PUBLIC = {
    "evaluate": "engine",
    "Decision": "engine",
    "load_config": "config",
    "Config": "config",
    "load_snapshot": "state.snapshot",
    "ClusterState": "state.model",
    "create_app": "serve",
}
__all__ = [
    "KUBERNETES_VERSION",
    "ClusterState",
    "Config",
    "Decision",
    "create_app",
    "evaluate",
    "load_config",
    "load_snapshot",
]

if TYPE_CHECKING:
    from .config import Config, load_config
    from .engine import Decision, evaluate
    from .serve import create_app
    from .state.model import ClusterState
    from .state.snapshot import load_snapshot


def lazy_names(package: str, public: dict[str, str]):
    """``__getattr__`` and ``__dir__`` for ``package``, whose ``public`` names (name -> the
    submodule that defines it) are imported on first use and then kept."""

    def __getattr__(name: str) -> object:
        module = public.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f".{module}", package), name)
        vars(sys.modules[package])[name] = value  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *public})

    return __getattr__, __dir__


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
