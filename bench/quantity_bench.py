"""Quantity parser benchmark: malformed quantities of growing length (the ReDoS of issue 15).

The parser before the fix used a pattern whose number part could split a run of digits in many
ways (``[0-9]+\\.?[0-9]*``); a failed match backtracked over every split: 1.7 s at 5,000
characters, 94 s at 40,000. That pattern is timed here once at 5,000 for the contrast; the
current parser is timed at every length (median of 5), and a valid 1,000,000-digit quantity too.
"""

from __future__ import annotations

import contextlib
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from webhook.kube.quantity import QuantityError, parse_quantity

BACKTRACKING = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+\.?[0-9]*|\.[0-9]+)"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?"
)


def _time(parse, text: str) -> float:
    started = time.perf_counter()
    with contextlib.suppress(QuantityError):
        parse(text)
    return time.perf_counter() - started


def main() -> None:
    started = time.perf_counter()
    BACKTRACKING.fullmatch("1" * 5000 + "x")
    print("target: linear in the length (issue 15: the old pattern took 1.7 s at n=5,000, 94 s at 40,000)")
    print(f"backtracking pattern (before), n=5,000: {(time.perf_counter() - started) * 1000:9.1f} ms")
    for n in (5_000, 20_000, 40_000, 1_000_000):
        runs = [_time(parse_quantity, "1" * n + "x") for _ in range(5)]  # over 64 characters: never cached
        print(f"parser (now),                 n={n:,}: {statistics.median(runs) * 1000:9.3f} ms")
    runs = [_time(parse_quantity, "1" * 1_000_000 + "m") for _ in range(5)]
    print(f"a valid 1,000,000-digit cpu quantity (saturates): {statistics.median(runs) * 1000:9.3f} ms")


if __name__ == "__main__":
    main()
