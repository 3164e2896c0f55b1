"""``stormBreaker``'s reason and settings: how many rejections in what window make a storm,
and how long its owner's pods wait for a probe. The audit calls a storm what would trip it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import NO_FIX, Mode, read_mode

if TYPE_CHECKING:
    from ...formats.reader import Reader

REASON = "AdmissionStorm"
MODES = NO_FIX


@dataclass(frozen=True, slots=True)
class StormBreakerConfig:
    mode: Mode = Mode.ENFORCE
    threshold: int = 20
    window_seconds: float = 300.0
    cooldown_seconds: float = 120.0


def read_settings(reader: Reader, data: Any, where: str) -> StormBreakerConfig:
    data = reader.mapping(data, where, {"mode", "threshold", "windowSeconds", "cooldownSeconds"})
    defaults = StormBreakerConfig()
    return StormBreakerConfig(
        mode=read_mode(reader, data, where, MODES),
        threshold=int(reader.number(data.get("threshold", defaults.threshold), f"{where}.threshold", 1)),
        window_seconds=reader.number(
            data.get("windowSeconds", defaults.window_seconds), f"{where}.windowSeconds", 1
        ),
        cooldown_seconds=reader.number(
            data.get("cooldownSeconds", defaults.cooldown_seconds), f"{where}.cooldownSeconds", 0.001
        ),
    )
