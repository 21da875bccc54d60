"""Server-rendered SVG charts: one small panel per tier, allowed and denied per minute.

Series are told apart by label and line style (solid vs dashed), not by
colour alone.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Panel", "panels"]

WIDTH = 600
PANEL_HEIGHT = 90
PAD_LEFT, PAD_RIGHT, PAD_TOP = 44, 70, 18


@dataclass(frozen=True)
class Panel:
    name: str
    top: int
    peak: int
    allowed_points: str
    denied_points: str
    allowed_last: int
    denied_last: int
    allowed_y: float
    denied_y: float


def _points(values: list[int], peak: int, top: int) -> str:
    if not values:
        return ""
    span = WIDTH - PAD_LEFT - PAD_RIGHT
    step = span / max(1, len(values) - 1)
    height = PANEL_HEIGHT - PAD_TOP - 10
    return " ".join(
        f"{PAD_LEFT + i * step:.1f},{top + PAD_TOP + height - height * v / peak:.1f}"
        for i, v in enumerate(values)
    )


def _last_y(points: str) -> float:
    return float(points.rsplit(",", 1)[1]) if points else 0.0


def panels(series: dict[str, dict[str, list[int]]]) -> list[Panel]:
    result = []
    for i, (name, data) in enumerate(series.items()):
        top = i * PANEL_HEIGHT
        peak = max([1, *data["allowed"], *data["denied"]])
        allowed = _points(data["allowed"], peak, top)
        denied = _points(data["denied"], peak, top)
        result.append(
            Panel(
                name=name,
                top=top,
                peak=peak,
                allowed_points=allowed,
                denied_points=denied,
                allowed_last=data["allowed"][-1] if data["allowed"] else 0,
                denied_last=data["denied"][-1] if data["denied"] else 0,
                allowed_y=_last_y(allowed),
                denied_y=_last_y(denied),
            )
        )
    return result


def height(count: int) -> int:
    return max(1, count) * PANEL_HEIGHT
