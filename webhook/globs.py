"""``*``/``?`` globs over resource names and identities, as the config writes them."""

from __future__ import annotations

from fnmatch import fnmatchcase
from functools import cache, lru_cache


@lru_cache(maxsize=4096)
def matches_any(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``name`` matches one of the globs: every review asks again for the same few
    resource names against the same patterns."""
    return any(fnmatchcase(name, p) for p in patterns)


def globs_overlap(first: str, second: str) -> bool:
    """Whether some string matches both ``*``/``?`` glob patterns."""

    @cache
    def meet(i: int, j: int) -> bool:
        if i == len(first) and j == len(second):
            return True
        if i < len(first) and first[i] == "*":
            return meet(i + 1, j) or (j < len(second) and meet(i, j + 1))
        if j < len(second) and second[j] == "*":
            return meet(i, j + 1) or (i < len(first) and meet(i + 1, j))
        if i == len(first) or j == len(second):
            return False
        return (first[i] == second[j] or "?" in (first[i], second[j])) and meet(i + 1, j + 1)

    return meet(0, 0)
