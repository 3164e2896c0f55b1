"""One strict reader for the files people write for the guard: its config and policy tests.

YAML is decoded as manifests are (``manifests.StrictLoader``: a duplicate key is an error
naming the key and its line; timestamps stay strings), and fields are checked by ``Reader``,
which records each problem with its field path and carries on with a safe value, so one run
lists every problem of a file. ``serve``, ``check`` and ``test`` share both, so a file one of
them accepts is a file all of them accept.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .manifests import StrictLoader, yaml_problem


class ReadError(ValueError):
    """A file the guard cannot use; the message starts with the file and names the field."""

    @classmethod
    def listing(cls, source: str, problems: list[str]) -> ReadError:
        """One problem on one line; several under their count."""
        if len(problems) == 1:
            return cls(f"{source}: {problems[0]}")
        listed = "\n  ".join(problems)
        return cls(f"{source}: {len(problems)} problems:\n  {listed}")


def load_yaml(path: str | Path, error: type[ReadError] = ReadError) -> Any:
    """The one YAML document in ``path``, strictly decoded; ``error`` names the file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise error(f"{path}: cannot read: {err.strerror}") from None
    except UnicodeDecodeError:
        raise error(f"{path}: cannot read: not UTF-8 text") from None
    try:
        return yaml.load(text, Loader=StrictLoader)
    except yaml.YAMLError as err:
        context = getattr(err, "context", None)  # "expected a single document in the stream"
        problem = f"{context}: {yaml_problem(err, text)}" if context else yaml_problem(err, text)
        raise error(f"{path}: invalid YAML: {problem}") from None
    except RecursionError:
        raise error(f"{path}: invalid YAML: nested too deeply") from None


class Reader:
    """Type checks that record a problem naming the field, then carry on with a safe value,
    so one run lists every problem of a file (``finish`` raises them together)."""

    def __init__(self, source: str, *, prefix: str = "", problems: list[str] | None = None) -> None:
        self.source = source
        self.prefix = prefix
        self.problems: list[str] = [] if problems is None else problems

    def within(self, where: str) -> Reader:
        """A reader for a document nested at ``where`` (a test case's config): its problems
        are listed with this file's, their field paths after ``where: ``."""
        return Reader(self.source, prefix=f"{self.prefix}{where}: ", problems=self.problems)

    def fail(self, where: str, message: str) -> None:
        self.problems.append(f"{self.prefix}{where or 'top level'}: {message}")

    def finish(self, error: type[ReadError] = ReadError) -> None:
        if self.problems:
            raise error.listing(self.source, self.problems)

    def mapping(self, data: Any, where: str, allowed: set[str] | None = None) -> Mapping[str, Any]:
        if not isinstance(data, Mapping):
            self.fail(where, "must be a mapping")
            return {}
        if allowed is not None:
            for key in data:
                if key not in allowed:
                    self.fail(f"{where}.{key}" if where else str(key), _unknown(str(key), allowed))
        return data

    def sequence(self, data: Any, where: str) -> list[Any]:
        if not isinstance(data, list):
            self.fail(where, "must be a list")
            return []
        return data

    def strings(self, data: Any, where: str) -> tuple[str, ...]:
        items = self.sequence(data, where)
        if not all(isinstance(s, str) for s in items):
            self.fail(where, "must be a list of strings")
            return ()
        return tuple(items)

    def number(self, data: Any, where: str, minimum: float) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float) or data < minimum:
            self.fail(where, f"must be a number >= {minimum:g}")
            return minimum
        return float(data)

    def boolean(self, data: Any, where: str, default: bool) -> bool:
        if not isinstance(data, bool):
            self.fail(where, "must be true or false")
            return default
        return data


def _unknown(key: str, allowed) -> str:
    """The message for a field not in ``allowed``: the one it differs from only in case is
    named first (``stormbreaker`` for ``stormBreaker``), then every field it may be."""
    expected = f"expected one of {', '.join(sorted(allowed))}"
    same = [name for name in allowed if name.lower() == key.lower()]
    return f"unknown field: did you mean {same[0]}? ({expected})" if same else f"unknown field ({expected})"
