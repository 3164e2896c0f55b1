"""Kubernetes semantics as pure functions over plain dicts (decoded YAML/JSON objects)."""
