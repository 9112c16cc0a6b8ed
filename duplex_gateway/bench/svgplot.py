"""Line charts as standalone SVG files, for the benchmarks (no plotting library needed).

A chart is a few labelled series of (x, y) points on linear or log-10 axes, with tick labels,
an optional dashed reference line (a budget or a target) and a legend. Any browser shows it.

Layout, so that nothing is drawn over anything else:

* the legend sits outside the plot area, in a right margin as wide as its longest name;
* the reference line's label sits inside the plot area, at an end (or the middle) of the line,
  above or below it, wherever it crosses the fewest data lines;
* each axis spans its data padded by 5% on each side (one distinct value: a range around it), so
  no point sits on the frame; linear axes get 1-2-5 ticks, whole numbers only on an integer axis
  (one the chart declares, or whose values are all whole); log axes get decade ticks.

SVG text has no size until a renderer lays it out, so text boxes are estimated (``GLYPH_EM``).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

__all__ = ["ASCENT_EM", "DESCENT_EM", "GLYPH_EM", "Chart", "cdf", "render_chart", "write_chart"]

_Point = tuple[float, float]  # in SVG pixels

# The average advance of one glyph, in ems: digits are 0.556 em in Helvetica, Arial and DejaVu
# Sans, lowercase letters about 0.5 em; 0.6 errs wide, so an estimated box holds the drawn text.
GLYPH_EM = 0.6
# How far a glyph reaches above and below the baseline, in ems (again erring large).
ASCENT_EM, DESCENT_EM = 0.8, 0.25

_FONT, _TITLE_FONT = 12, 15
_PLOT_W, _PLOT_H = 490, 355
_TOP, _BOTTOM = 40, 55
_MIN_LEFT, _MIN_WIDTH = 70, 720
_EDGE = 10  # blank space kept at the canvas's edges
_Y_NAME_X = 18  # baseline of the rotated y-axis name
_TICK_GAP = 6  # between a tick label and the frame
_X_TICK_BASELINE = 18  # below the frame
_TITLE_BASELINE = 22
_LEGEND_GAP, _LEGEND_PAD, _LEGEND_ROW, _SWATCH = 12, 10, 18, 20
_REFERENCE_GAP = 4  # between the reference line and its label
_PAD = 0.05  # each axis's data range grows by this fraction on each side
_MAX_LOG_TICKS = 8  # more decades than this: label every second (third...) one
_MAX_MARKED = 16  # series this short also get a dot per point
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")
# Characters XML 1.0 forbids even when escaped; a title holding one would spoil the file.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


@dataclass(frozen=True, slots=True, kw_only=True)
class Chart:
    """What to draw.

    Attributes:
        title: the heading.
        x_label, y_label: the axis names, units included.
        series: name -> points, drawn in order; empty series are left out.
        log_x: a log-10 x axis (latency distributions span decades).
        reference: a dashed horizontal line at this y, with its label.
        integer_x, integer_y: ticks at whole numbers only (batch sizes, session counts); an
            axis whose values are all whole numbers gets them anyway.
    """

    title: str
    x_label: str
    y_label: str
    series: Mapping[str, Sequence[tuple[float, float]]]
    log_x: bool = False
    reference: tuple[float, str] | None = None
    integer_x: bool = False
    integer_y: bool = False


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


def write_chart(path: Path, chart: Chart) -> Path:
    """Write ``chart`` as SVG to ``path`` (its folder must exist); returns ``path``.

    Raises:
        ValueError: nothing to draw, a value that is not finite, or a non-positive x on a log
            axis.
    """
    path.write_text(render_chart(chart), encoding="utf-8")
    return path


# --- geometry -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Box:
    """An axis-aligned rectangle in SVG pixels (y grows downwards)."""

    left: float
    top: float
    right: float
    bottom: float

    def within(self, other: _Box) -> bool:
        return (other.left <= self.left and self.right <= other.right
                and other.top <= self.top and self.bottom <= other.bottom)

    def hit_by(self, a: tuple[float, float], b: tuple[float, float]) -> bool:
        """Whether the segment a-b touches this box (Liang-Barsky clipping)."""
        dx, dy = b[0] - a[0], b[1] - a[1]
        enter, leave = 0.0, 1.0
        for p, q in ((-dx, a[0] - self.left), (dx, self.right - a[0]),
                     (-dy, a[1] - self.top), (dy, self.bottom - a[1])):
            if p == 0:
                if q < 0:
                    return False  # parallel to this edge and outside it
                continue
            t = q / p
            if p < 0:
                enter = max(enter, t)
            else:
                leave = min(leave, t)
            if enter > leave:
                return False
        return True


def _text_width(text: str, size: float) -> float:
    return len(text) * size * GLYPH_EM


def _text_box(x: float, baseline: float, text: str, size: float, anchor: str) -> _Box:
    """The estimated box of ``text`` drawn at (x, baseline) with this text-anchor."""
    width = _text_width(text, size)
    left = {"start": x, "middle": x - width / 2, "end": x - width}[anchor]
    return _Box(left, baseline - size * ASCENT_EM, left + width, baseline + size * DESCENT_EM)


# --- axes -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Axis:
    """One axis: the data values at the frame's two ends, and where the ticks go."""

    low: float
    high: float
    log: bool
    ticks: tuple[float, ...]

    def fraction(self, value: float) -> float:
        """How far along the axis ``value`` lies, 0 at ``low`` and 1 at ``high``."""
        if self.log:
            low, high = math.log10(self.low), math.log10(self.high)
            return (math.log10(value) - low) / (high - low)
        return (value - self.low) / (self.high - self.low)


def _linear_axis(low: float, high: float, integer: bool) -> _Axis:
    if high == low:
        # One distinct value: a range around it, so that it is drawn mid-axis, not at 0/0.
        half = 1.0 if integer or low == 0 else abs(low) * 0.1
        low, high = low - half, high + half
    else:
        pad = (high - low) * _PAD
        low, high = low - pad, high + pad
    return _Axis(low, high, False, tuple(_nice_ticks(low, high, integer)))


def _nice_step(span: float, integer: bool) -> float:
    """The 1-2-5 step nearest to a fifth of ``span`` (so 3 to 7 intervals); at least 1 on an
    integer axis."""
    raw = span / 5
    magnitude = 10.0 ** math.floor(math.log10(raw))
    # Each threshold sits about midway (geometrically) between two neighbouring steps.
    multiple = next(m for m, below in ((1, 1.5), (2, 3.0), (5, 7.0), (10, math.inf))
                    if raw / magnitude < below)
    step = multiple * magnitude
    return max(1.0, float(round(step))) if integer else step


def _nice_ticks(low: float, high: float, integer: bool) -> list[float]:
    step = _nice_step(high - low, integer)
    first, last = math.ceil(low / step - 1e-9), math.floor(high / step + 1e-9)
    # Rounding to 12 significant digits drops float noise such as 0.30000000000000004.
    return [float(f"{k * step:.12g}") for k in range(first, last + 1)]


def _log_axis(low: float, high: float) -> _Axis:
    low_e, high_e = math.log10(low), math.log10(high)
    if high_e == low_e:
        low_e, high_e = low_e - 0.5, high_e + 0.5  # one distinct value: a decade around it
    else:
        pad = (high_e - low_e) * _PAD
        low_e, high_e = low_e - pad, high_e + pad
    return _Axis(10.0 ** low_e, 10.0 ** high_e, True, tuple(_log_ticks(low_e, high_e)))


def _log_ticks(low_e: float, high_e: float) -> list[float]:
    """Decades between the exponents; 1-2-5 multiples, then linear ticks, on a short axis."""
    decades = range(math.ceil(low_e - 1e-9), math.floor(high_e + 1e-9) + 1)
    if len(decades) >= 2:
        every = math.ceil(len(decades) / _MAX_LOG_TICKS)
        return [10.0 ** e for e in decades[::every]]
    multiples = [float(f"{m * 10.0 ** e:.12g}")
                 for e in range(math.floor(low_e), math.ceil(high_e) + 1) for m in (1, 2, 5)]
    inside = [t for t in multiples if low_e - 1e-9 <= math.log10(t) <= high_e + 1e-9]
    if len(inside) >= 2:
        return inside
    return [t for t in _nice_ticks(10.0 ** low_e, 10.0 ** high_e, False) if t > 0]


def _is_whole(values: Sequence[float]) -> bool:
    return all(v.is_integer() for v in values)


def _axes(chart: Chart, drawn: Mapping[str, Sequence[tuple[float, float]]]) -> tuple[_Axis, _Axis]:
    xs = [float(x) for points in drawn.values() for x, _ in points]
    ys = [float(y) for points in drawn.values() for _, y in points]
    if chart.reference is not None:
        ys.append(float(chart.reference[0]))
    if not all(math.isfinite(v) for v in (*xs, *ys)):
        raise ValueError("every value must be finite")
    if chart.log_x and min(xs) <= 0:
        raise ValueError("a log axis needs positive x values")
    if chart.log_x:
        x_axis = _log_axis(min(xs), max(xs))
    else:
        x_axis = _linear_axis(min(xs), max(xs), chart.integer_x or _is_whole(xs))
    # The y axis starts at zero (or below it): step times and fractions are read from zero.
    y_axis = _linear_axis(min(0.0, min(ys)), max(ys), chart.integer_y or _is_whole(ys))
    return x_axis, y_axis


def _tick_label(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e5 else f"{value:.0e}"


# --- layout ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where everything goes: the canvas, the plot area inside it, the legend to its right."""

    width: float
    height: float
    plot: _Box
    legend: _Box
    x_axis: _Axis
    y_axis: _Axis

    def point(self, x: float, y: float) -> _Point:
        plot = self.plot
        return (plot.left + self.x_axis.fraction(x) * (plot.right - plot.left),
                plot.bottom - self.y_axis.fraction(y) * (plot.bottom - plot.top))


def _layout(chart: Chart, names: Sequence[str], x_axis: _Axis, y_axis: _Axis) -> _Layout:
    widest_tick = max(_text_width(_tick_label(y), _FONT) for y in y_axis.ticks)
    # The y ticks' labels end _TICK_GAP before the frame and start _TICK_GAP after the
    # rotated y-axis name, whose glyphs reach DESCENT_EM past its baseline.
    name_edge = _Y_NAME_X + _FONT * DESCENT_EM
    left = max(_MIN_LEFT, math.ceil(name_edge + 2 * _TICK_GAP + widest_tick))
    plot = _Box(left, _TOP, left + _PLOT_W, _TOP + _PLOT_H)
    widest_name = max(_text_width(name, _FONT) for name in names)
    legend_left = plot.right + _LEGEND_GAP
    legend = _Box(legend_left, _TOP,
                  legend_left + 2 * _LEGEND_PAD + _SWATCH + _TICK_GAP + widest_name,
                  _TOP + len(names) * _LEGEND_ROW + _LEGEND_PAD)
    width = max(_MIN_WIDTH, math.ceil(legend.right + _EDGE),
                math.ceil(_text_width(chart.title, _TITLE_FONT) + 2 * _EDGE))
    height = max(plot.bottom + _BOTTOM, math.ceil(legend.bottom + _EDGE))
    return _Layout(width, height, plot, legend, x_axis, y_axis)


def _segments(points: Sequence[_Point]) -> list[tuple[_Point, _Point]]:
    """A polyline's segments; a lone point is a segment of length zero."""
    return list(itertools.pairwise(points)) if len(points) > 1 else [(points[0], points[0])]


def _reference_placement(plot: _Box, line_y: float, label: str,
                         lines: Sequence[Sequence[_Point]]) -> tuple[float, float, str]:
    """(x, baseline, text-anchor) for the reference label: inside the plot area, next to its
    line, over as few data lines as can be (ties: the left end, above the line, first)."""
    above = line_y - _REFERENCE_GAP - _FONT * DESCENT_EM
    below = line_y + _REFERENCE_GAP + _FONT * ASCENT_EM
    ends = ((plot.left + _TICK_GAP, "start"), (plot.right - _TICK_GAP, "end"),
            ((plot.left + plot.right) / 2, "middle"))
    candidates = [(x, baseline, anchor) for x, anchor in ends for baseline in (above, below)]

    def crossings(candidate: tuple[float, float, str]) -> int:
        box = _text_box(candidate[0], candidate[1], label, _FONT, candidate[2])
        return sum(box.hit_by(a, b) for points in lines for a, b in _segments(points))

    fitting = [c for c in candidates if _text_box(c[0], c[1], label, _FONT, c[2]).within(plot)]
    return min(fitting, key=crossings) if fitting else candidates[0]


# --- drawing --------------------------------------------------------------------------------


def _text(value: str) -> str:
    return escape(_NOT_XML.sub("", value))


def render_chart(chart: Chart) -> str:
    """``chart`` as the text of an SVG file.

    Raises:
        ValueError: as ``write_chart``.
    """
    drawn = {name: list(points) for name, points in chart.series.items() if points}
    if not drawn:
        raise ValueError("no points to draw")
    x_axis, y_axis = _axes(chart, drawn)
    layout = _layout(chart, list(drawn), x_axis, y_axis)
    placed = {name: [layout.point(x, y) for x, y in points] for name, points in drawn.items()}
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{layout.width}" '
        f'height="{layout.height}" viewBox="0 0 {layout.width} {layout.height}" '
        f'font-family="sans-serif" font-size="{_FONT}">',
        f'<rect width="{layout.width}" height="{layout.height}" fill="white"/>',
        f'<text class="title" x="{layout.width / 2}" y="{_TITLE_BASELINE}" '
        f'text-anchor="middle" font-size="{_TITLE_FONT}">{_text(chart.title)}</text>',
        *_grid(layout),
        *_axis_names(chart, layout),
        *_reference(chart, layout, list(placed.values())),
        *_series(placed),
        *_legend(layout, list(drawn)),
        "</svg>",
    ]
    return "\n".join(out) + "\n"


def _grid(layout: _Layout) -> list[str]:
    """Grid lines, tick labels and the frame."""
    plot = layout.plot
    out = []
    for x in layout.x_axis.ticks:
        at = layout.point(x, layout.y_axis.low)[0]
        out.append(f'<line x1="{at:.1f}" y1="{plot.top}" x2="{at:.1f}" y2="{plot.bottom}" '
                   'stroke="#ddd"/>')
        out.append(f'<text class="x-tick" x="{at:.1f}" y="{plot.bottom + _X_TICK_BASELINE}" '
                   f'text-anchor="middle">{_tick_label(x)}</text>')
    for y in layout.y_axis.ticks:
        at = layout.point(layout.x_axis.low, y)[1]
        out.append(f'<line x1="{plot.left}" y1="{at:.1f}" x2="{plot.right}" y2="{at:.1f}" '
                   'stroke="#ddd"/>')
        # Shifted down by a third of an em, so the digits' middle is level with the grid line.
        out.append(f'<text class="y-tick" x="{plot.left - _TICK_GAP}" y="{at + _FONT / 3:.1f}" '
                   f'text-anchor="end">{_tick_label(y)}</text>')
    out.append(f'<rect class="plot-area" x="{plot.left}" y="{plot.top}" '
               f'width="{plot.right - plot.left}" height="{plot.bottom - plot.top}" '
               'fill="none" stroke="#333"/>')
    return out


def _axis_names(chart: Chart, layout: _Layout) -> list[str]:
    plot = layout.plot
    middle_y = (plot.top + plot.bottom) / 2
    return [
        f'<text class="axis-name" x="{(plot.left + plot.right) / 2}" y="{layout.height - 14}" '
        f'text-anchor="middle">{_text(chart.x_label)}</text>',
        f'<text class="axis-name" x="{_Y_NAME_X}" y="{middle_y}" '
        f'transform="rotate(-90 {_Y_NAME_X} {middle_y})" text-anchor="middle">'
        f"{_text(chart.y_label)}</text>",
    ]


def _reference(chart: Chart, layout: _Layout,
               lines: Sequence[Sequence[tuple[float, float]]]) -> list[str]:
    if chart.reference is None:
        return []
    value, label = chart.reference
    plot = layout.plot
    line_y = layout.point(layout.x_axis.low, value)[1]
    x, baseline, anchor = _reference_placement(plot, line_y, _NOT_XML.sub("", label), lines)
    return [
        f'<line class="reference" x1="{plot.left}" y1="{line_y:.1f}" x2="{plot.right}" '
        f'y2="{line_y:.1f}" stroke="#555" stroke-dasharray="6 4"/>',
        f'<text class="reference-label" x="{x:.1f}" y="{baseline:.1f}" '
        f'text-anchor="{anchor}" fill="#333">{_text(label)}</text>',
    ]


def _series(placed: Mapping[str, Sequence[tuple[float, float]]]) -> list[str]:
    out = []
    for index, (name, points) in enumerate(placed.items()):
        colour = _COLOURS[index % len(_COLOURS)]
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        out.append(f'<polyline class="series" fill="none" stroke="{colour}" '
                   f'stroke-width="1.8" points="{coords}"><title>{_text(name)}</title></polyline>')
        if len(points) <= _MAX_MARKED:
            out.extend(f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="3" '
                       f'fill="{colour}"/>' for x, y in points)
    return out


def _legend(layout: _Layout, names: Sequence[str]) -> list[str]:
    box = layout.legend
    out = ['<g class="legend">',
           f'<rect class="legend-box" x="{box.left:.1f}" y="{box.top:.1f}" '
           f'width="{box.right - box.left:.1f}" height="{box.bottom - box.top:.1f}" '
           'fill="white" stroke="#ccc"/>']
    for index, name in enumerate(names):
        colour = _COLOURS[index % len(_COLOURS)]
        middle = box.top + _LEGEND_PAD / 2 + _LEGEND_ROW * (index + 0.5)
        swatch_left = box.left + _LEGEND_PAD
        out.append(f'<line x1="{swatch_left:.1f}" y1="{middle:.1f}" '
                   f'x2="{swatch_left + _SWATCH:.1f}" y2="{middle:.1f}" stroke="{colour}" '
                   'stroke-width="3"/>')
        out.append(f'<text class="legend-entry" x="{swatch_left + _SWATCH + _TICK_GAP:.1f}" '
                   f'y="{middle + _FONT / 3:.1f}">{_text(name)}</text>')
    out.append("</g>")
    return out
