"""The usage pages' chart: a bar per day of the period, one small panel per resource.

The first panel counts the caller's requests (admitted, with the denied ones stacked
on top, dashed and labelled so that colour is not the only difference); each other
panel counts a resource's units. Every panel has a value axis from 0 to a round
maximum; the day axis under the last panel labels the day of the month and, under
the first day and each 1st, the month.
"""

from __future__ import annotations

import calendar
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date

from flask_quota.admin_api import UsageReport

from .chart import Tick, _round_up

__all__ = ["Bar", "BarChart", "BarPanel", "build"]

WIDTH = 640
PAD_LEFT, PAD_RIGHT = 52, 12
TITLE = 22  # px above each plot for the panel's name
PLOT = 80  # px of plot per panel
GAP = 16  # px between one panel's plot and the next panel's title
PANEL_HEIGHT = TITLE + PLOT + GAP
AXIS = 30  # px under the last panel for the day and month labels
MAX_DAY_LABELS = 16  # more days than this: every other day is labelled


@dataclass(frozen=True)
class Bar:
    """One day's bar (``denied_height`` stacked on top of ``height``), in SVG units."""

    x: float
    width: float
    y: float
    height: float
    denied_y: float
    denied_height: float
    title: str  # what a pointer over the bar says: the day and its counts


@dataclass(frozen=True)
class BarPanel:
    name: str
    top: int  # the panel's title line
    plot_top: int
    plot_bottom: int
    total: int
    y_ticks: tuple[Tick, ...]
    bars: tuple[Bar, ...]
    stacked: bool  # denied requests drawn on top of the admitted ones


@dataclass(frozen=True)
class BarChart:
    width: int
    height: int
    left: int
    right: int
    panels: tuple[BarPanel, ...]
    day_ticks: tuple[Tick, ...]
    month_ticks: tuple[Tick, ...]
    day_y: int  # baselines of the day and month labels
    month_y: int


def _y(value: int, top_value: int, plot_top: int) -> float:
    return plot_top + PLOT - PLOT * value / top_value


def _panel(
    index: int,
    name: str,
    days: list[date],
    used: list[int],
    denied: list[int] | None,
    unit: str = "units",
) -> BarPanel:
    top = index * PANEL_HEIGHT
    plot_top = top + TITLE
    heights = [u + d for u, d in zip(used, denied, strict=True)] if denied is not None else used
    peak = max([0, *heights])
    top_value = _round_up(max(1, peak))
    values = [0, top_value // 2, top_value] if top_value % 2 == 0 else [0, top_value]
    slot = (WIDTH - PAD_LEFT - PAD_RIGHT) / len(days)
    bars = []
    for i, day in enumerate(days):
        value, refused = used[i], denied[i] if denied is not None else 0
        y = _y(value, top_value, plot_top)
        denied_y = _y(value + refused, top_value, plot_top)
        title = f"{day.isoformat()}: {value} {'admitted' if denied is not None else unit}"
        bars.append(
            Bar(
                x=PAD_LEFT + i * slot + slot * 0.15,
                width=slot * 0.7,
                y=y,
                height=plot_top + PLOT - y,
                denied_y=denied_y,
                denied_height=y - denied_y,
                title=title + (f", {refused} denied" if denied is not None else ""),
            )
        )
    return BarPanel(
        name=name,
        top=top,
        plot_top=plot_top,
        plot_bottom=plot_top + PLOT,
        total=sum(used),
        y_ticks=tuple(Tick(_y(v, top_value, plot_top), str(v)) for v in values),
        bars=tuple(bars),
        stacked=denied is not None,
    )


def build(report: UsageReport, units: Mapping[str, str] | None = None) -> BarChart:
    """The chart of ``report``'s days: a panel for the caller's requests when it made
    any (or has a quota on them), then one per resource, as its totals list them, in
    the unit it counts (``units``: a resource's own, such as tokens; else "units")."""
    units = units or {}
    days = report.days
    index = {day: i for i, day in enumerate(days)}
    panels: list[BarPanel] = []
    for total in report.totals:
        used, denied = [0] * len(days), [0] * len(days)
        for line in report.lines:
            if line.resource == total.resource and line.day in index:
                used[index[line.day]] += line.used
                denied[index[line.day]] += line.denied
        unit = units.get(total.resource, "units")
        name = f"{total.resource} ({unit})" if total.resource else "requests"
        stacked = denied if not total.resource else None
        panels.append(_panel(len(panels), name, days, used, stacked, unit))
    body = max(1, len(panels)) * PANEL_HEIGHT
    slot = (WIDTH - PAD_LEFT - PAD_RIGHT) / max(1, len(days))
    step = 1 if len(days) <= MAX_DAY_LABELS else math.ceil(len(days) / MAX_DAY_LABELS)
    centre = [PAD_LEFT + (i + 0.5) * slot for i in range(len(days))]
    return BarChart(
        width=WIDTH,
        height=body + AXIS,
        left=PAD_LEFT,
        right=WIDTH - PAD_RIGHT,
        panels=tuple(panels),
        day_ticks=tuple(
            Tick(centre[i], str(day.day)) for i, day in enumerate(days) if i % step == 0
        ),
        month_ticks=tuple(
            Tick(centre[i], calendar.month_abbr[day.month])
            for i, day in enumerate(days)
            if i == 0 or day.day == 1
        ),
        day_y=body - GAP + 16,
        month_y=body - GAP + 30,
    )
