"""Server-rendered SVG charts: one small panel per tier, allowed and denied per minute.

Every panel has a value axis (requests per minute, from 0 to a round maximum)
and shares one time axis (a tick every 10 minutes, HH:MM in UTC) drawn under
the last panel, with grid lines through all of them. Series are told apart by
label and line style (solid vs dashed), not by colour alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["Chart", "Panel", "Tick", "build"]

WIDTH = 640
PAD_LEFT, PAD_RIGHT = 52, 96  # value labels on the left, end labels on the right
TITLE = 22  # px above each plot for the panel's name
PLOT = 70  # px of plot per panel
GAP = 14  # px between one panel's plot and the next panel's title
PANEL_HEIGHT = TITLE + PLOT + GAP
AXIS = 12  # px added under the last panel's gap, for the time labels
LABEL_GAP = 15  # px between the end labels' baselines: a 12 px line box is 14 px tall
TICK_MINUTES = 10


@dataclass(frozen=True)
class Tick:
    """A labelled position on an axis (x for time, y for values), in SVG units."""

    pos: float
    label: str


@dataclass(frozen=True)
class Panel:
    name: str
    top: int  # the panel's title line
    plot_top: int
    plot_bottom: int
    peak: int  # the highest count, per minute
    y_ticks: tuple[Tick, ...]
    allowed_points: str
    denied_points: str
    allowed_last: int
    denied_last: int
    allowed_y: float  # baselines of the end labels, inside the panel and apart
    denied_y: float


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    left: int
    right: int  # x where the plots end
    panels: tuple[Panel, ...]
    x_ticks: tuple[Tick, ...]
    axis_y: int  # baseline of the time labels


def _round_up(peak: int) -> int:
    """The axis maximum: the smallest 1, 2 or 5 times a power of ten at or above ``peak``."""
    scale = 1
    while True:
        for step in (1, 2, 5):
            if step * scale >= peak:
                return step * scale
        scale *= 10


def _count(value: int) -> str:
    return f"{value // 1000}k" if value >= 10_000 and value % 1000 == 0 else str(value)


def _x(index: int, count: int) -> float:
    return PAD_LEFT + index * (WIDTH - PAD_LEFT - PAD_RIGHT) / max(1, count - 1)


def _y(value: int, top_value: int, plot_top: int) -> float:
    return plot_top + PLOT - PLOT * value / top_value


def _points(values: list[int], top_value: int, plot_top: int) -> str:
    return " ".join(
        f"{_x(i, len(values)):.1f},{_y(v, top_value, plot_top):.1f}" for i, v in enumerate(values)
    )


def _label_ys(
    allowed: tuple[int, float], denied: tuple[int, float], plot_top: int
) -> tuple[float, float]:
    """Baselines for the two end labels: beside their line ends, never overlapping each
    other and never outside the panel (a label below the last panel would run into the
    time axis; one above the first was clipped)."""
    low, high = plot_top + 8, plot_top + PLOT + 4
    # +4: text centred on the point; each label is kept in the panel on its own first,
    # so a label clamped at one edge cannot push the other one out at the far edge.
    a = min(max(allowed[1] + 4, low), high)
    d = min(max(denied[1] + 4, low), high)
    if abs(a - d) < LABEL_GAP:  # side by side: the larger count's label goes on top
        mid = min(max((a + d) / 2, low + LABEL_GAP / 2), high - LABEL_GAP / 2)
        upper, lower = mid - LABEL_GAP / 2, mid + LABEL_GAP / 2
        a, d = (upper, lower) if allowed[0] >= denied[0] else (lower, upper)
    return a, d


def time_ticks(minutes: list[int]) -> tuple[Tick, ...]:
    """A tick on every whole 10 minutes of the span (epoch minutes, oldest first)."""
    return tuple(
        Tick(_x(i, len(minutes)), time.strftime("%H:%M", time.gmtime(m * 60)))
        for i, m in enumerate(minutes)
        if m % TICK_MINUTES == 0
    )


def _panel(index: int, name: str, data: dict[str, list[int]]) -> Panel:
    top = index * PANEL_HEIGHT
    plot_top = top + TITLE
    peak = max([0, *data["allowed"], *data["denied"]])
    top_value = _round_up(max(1, peak))
    values = [0, top_value // 2, top_value] if top_value % 2 == 0 else [0, top_value]
    allowed = _points(data["allowed"], top_value, plot_top)
    denied = _points(data["denied"], top_value, plot_top)
    allowed_last = data["allowed"][-1] if data["allowed"] else 0
    denied_last = data["denied"][-1] if data["denied"] else 0
    allowed_y, denied_y = _label_ys(
        (allowed_last, _y(allowed_last, top_value, plot_top)),
        (denied_last, _y(denied_last, top_value, plot_top)),
        plot_top,
    )
    return Panel(
        name=name,
        top=top,
        plot_top=plot_top,
        plot_bottom=plot_top + PLOT,
        peak=peak,
        y_ticks=tuple(Tick(_y(v, top_value, plot_top), _count(v)) for v in values),
        allowed_points=allowed,
        denied_points=denied,
        allowed_last=allowed_last,
        denied_last=denied_last,
        allowed_y=allowed_y,
        denied_y=denied_y,
    )


def build(series: dict[str, dict[str, list[int]]], minutes: list[int]) -> Chart:
    """The chart of ``series`` (per tier: allowed and denied per minute, oldest first)
    over ``minutes`` (the epoch minute of each value)."""
    panels = tuple(_panel(i, name, data) for i, (name, data) in enumerate(series.items()))
    body = max(1, len(panels)) * PANEL_HEIGHT
    return Chart(
        width=WIDTH,
        height=body + AXIS,
        left=PAD_LEFT,
        right=WIDTH - PAD_RIGHT,
        panels=panels,
        x_ticks=time_ticks(minutes) if panels else (),
        axis_y=body - GAP + 21,  # a text line under the last panel's "0"
    )
