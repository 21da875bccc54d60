"""Server-rendered SVG charts: one small panel per tier, allowed and denied per minute.

Series are told apart by label and line style (solid vs dashed), not by
colour alone.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Panel", "panels"]

WIDTH = 600
PANEL_HEIGHT = 90
PAD_LEFT, PAD_RIGHT, PAD_TOP = 44, 84, 18
LABEL_GAP = 12  # px between the "allowed" and "denied" end labels (11 px text)


@dataclass(frozen=True)
class Panel:
    name: str
    top: int
    peak: int
    allowed_points: str
    denied_points: str
    allowed_last: int
    denied_last: int
    allowed_y: float  # baselines of the end labels, inside the panel and apart
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


def _label_ys(
    allowed: tuple[int, float], denied: tuple[int, float], top: int
) -> tuple[float, float]:
    """Baselines for the two end labels: beside their line ends, never overlapping each
    other and never outside the panel (a label below the last panel was clipped)."""
    a, d = allowed[1] + 4, denied[1] + 4  # +4: text centred on the point
    if abs(a - d) < LABEL_GAP:  # same height: the larger count's label goes on top
        mid = (a + d) / 2
        upper, lower = mid - LABEL_GAP / 2, mid + LABEL_GAP / 2
        a, d = (upper, lower) if allowed[0] >= denied[0] else (lower, upper)
    low, high = top + LABEL_GAP, top + PANEL_HEIGHT - 3
    shift = max(0.0, max(a, d) - high) - max(0.0, low - min(a, d))
    return a - shift, d - shift


def panels(series: dict[str, dict[str, list[int]]]) -> list[Panel]:
    """One chart panel per series: allowed and denied lines scaled to its peak."""
    result = []
    for i, (name, data) in enumerate(series.items()):
        top = i * PANEL_HEIGHT
        peak = max([1, *data["allowed"], *data["denied"]])
        allowed = _points(data["allowed"], peak, top)
        denied = _points(data["denied"], peak, top)
        allowed_last = data["allowed"][-1] if data["allowed"] else 0
        denied_last = data["denied"][-1] if data["denied"] else 0
        allowed_y, denied_y = _label_ys(
            (allowed_last, _last_y(allowed)), (denied_last, _last_y(denied)), top
        )
        result.append(
            Panel(
                name=name,
                top=top,
                peak=peak,
                allowed_points=allowed,
                denied_points=denied,
                allowed_last=allowed_last,
                denied_last=denied_last,
                allowed_y=allowed_y,
                denied_y=denied_y,
            )
        )
    return result


def height(count: int) -> int:
    return max(1, count) * PANEL_HEIGHT
