"""Line charts as standalone SVG files, for the benchmarks (no plotting library needed).

A chart is a few labelled series of (x, y) points on linear or log-10 axes, with tick labels,
an optional dashed reference line (a budget or a target) and a legend. Any browser shows it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

__all__ = ["Chart", "cdf", "write_chart"]

_WIDTH, _HEIGHT = 720, 450
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 160, 40, 55
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")


@dataclass(frozen=True, slots=True, kw_only=True)
class Chart:
    """What to draw.

    Attributes:
        title: the heading.
        x_label, y_label: the axis names, units included.
        series: name -> points, drawn in order; empty series are left out.
        log_x: a log-10 x axis (latency distributions span decades).
        reference: a dashed horizontal line at this y, with its label.
    """

    title: str
    x_label: str
    y_label: str
    series: Mapping[str, Sequence[tuple[float, float]]]
    log_x: bool = False
    reference: tuple[float, str] | None = None


def cdf(samples: Sequence[float], *, points: int = 400) -> list[tuple[float, float]]:
    """The empirical CDF of ``samples`` as at most ``points`` (value, fraction) pairs."""
    ordered = sorted(samples)
    if not ordered:
        return []
    step = max(1, len(ordered) // points)
    picked = list(range(0, len(ordered), step))
    if picked[-1] != len(ordered) - 1:
        picked.append(len(ordered) - 1)
    return [(ordered[i], (i + 1) / len(ordered)) for i in picked]


def _ticks(low: float, high: float, log: bool) -> list[float]:
    if log:
        return [10.0 ** e for e in range(math.floor(math.log10(low)),
                                         math.ceil(math.log10(high)) + 1)]
    span = high - low or 1.0
    raw = span / 5
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    count = max(1, math.ceil((high - first) / step - 1e-9))  # the last tick is the first >= high
    return [first + i * step for i in range(count + 1)]


def _label(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e5 else f"{value:.0e}"


def write_chart(path: Path, chart: Chart) -> Path:
    """Write ``chart`` as SVG to ``path`` (its folder must exist); returns ``path``.

    Raises:
        ValueError: nothing to draw, or a non-positive x on a log axis.
    """
    drawn = {name: list(points) for name, points in chart.series.items() if points}
    if not drawn:
        raise ValueError("no points to draw")
    xs = [x for points in drawn.values() for x, _ in points]
    ys = [y for points in drawn.values() for _, y in points]
    if chart.reference is not None:
        ys.append(chart.reference[0])
    if chart.log_x and min(xs) <= 0:
        raise ValueError("a log axis needs positive x values")
    x_ticks = _ticks(min(xs), max(xs), chart.log_x)
    y_ticks = _ticks(min(0.0, min(ys)), max(ys), False)
    x_low, x_high = x_ticks[0], x_ticks[-1]
    y_low, y_high = y_ticks[0], y_ticks[-1]
    plot_w = _WIDTH - _LEFT - _RIGHT
    plot_h = _HEIGHT - _TOP - _BOTTOM

    def px(x: float) -> float:
        if chart.log_x:
            fraction = (math.log10(x) - math.log10(x_low)) / (
                math.log10(x_high) - math.log10(x_low) or 1.0)
        else:
            fraction = (x - x_low) / (x_high - x_low or 1.0)
        return _LEFT + fraction * plot_w

    def py(y: float) -> float:
        return _TOP + plot_h - (y - y_low) / (y_high - y_low or 1.0) * plot_h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" '
        f'viewBox="0 0 {_WIDTH} {_HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{_WIDTH}" height="{_HEIGHT}" fill="white"/>',
        f'<text x="{_WIDTH / 2}" y="22" text-anchor="middle" font-size="15">'
        f"{escape(chart.title)}</text>",
    ]
    for x in x_ticks:
        out.append(f'<line x1="{px(x):.1f}" y1="{_TOP}" x2="{px(x):.1f}" '
                   f'y2="{_TOP + plot_h}" stroke="#ddd"/>')
        out.append(f'<text x="{px(x):.1f}" y="{_TOP + plot_h + 16}" '
                   f'text-anchor="middle">{_label(x)}</text>')
    for y in y_ticks:
        out.append(f'<line x1="{_LEFT}" y1="{py(y):.1f}" x2="{_LEFT + plot_w}" '
                   f'y2="{py(y):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{py(y) + 4:.1f}" '
                   f'text-anchor="end">{_label(y)}</text>')
    out.append(f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}" '
               'fill="none" stroke="#333"/>')
    out.append(f'<text x="{_LEFT + plot_w / 2}" y="{_HEIGHT - 14}" text-anchor="middle">'
               f"{escape(chart.x_label)}</text>")
    out.append(f'<text transform="translate(18 {_TOP + plot_h / 2}) rotate(-90)" '
               f'text-anchor="middle">{escape(chart.y_label)}</text>')
    legend_y = _TOP + 10
    if chart.reference is not None:
        value, label = chart.reference
        out.append(f'<line x1="{_LEFT}" y1="{py(value):.1f}" x2="{_LEFT + plot_w}" '
                   f'y2="{py(value):.1f}" stroke="#555" stroke-dasharray="6 4"/>')
        out.append(f'<text x="{_LEFT + plot_w + 10}" y="{py(value) + 4:.1f}">'
                   f"{escape(label)}</text>")
    for index, (name, points) in enumerate(drawn.items()):
        colour = _COLOURS[index % len(_COLOURS)]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.8" '
                   f'points="{coords}"><title>{escape(name)}</title></polyline>')
        if len(points) == 1:
            x, y = points[0]
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>')
        out.append(f'<line x1="{_LEFT + plot_w + 10}" y1="{legend_y}" '
                   f'x2="{_LEFT + plot_w + 30}" y2="{legend_y}" stroke="{colour}" '
                   'stroke-width="3"/>')
        out.append(f'<text x="{_LEFT + plot_w + 36}" y="{legend_y + 4}">{escape(name)}</text>')
        legend_y += 18
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")
    return path
