"""The benchmarks' SVG charts: well-formed, one line per series, axes that fit the data, and
no text drawn over other text (boxes estimated the way svgplot documents)."""

from __future__ import annotations

import itertools
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from duplex_gateway.bench.svgplot import ASCENT_EM, DESCENT_EM, GLYPH_EM, Chart, cdf, write_chart

SVG = "{http://www.w3.org/2000/svg}"
Box = tuple[float, float, float, float]  # left, top, right, bottom

WORKER_SERIES = {
    "eager p50": [(1.0, 20.6), (2.0, 31.1), (4.0, 42.1), (8.0, 55.2), (16.0, 78.1), (32.0, 96.3)],
    "eager p99": [(1.0, 22.9), (2.0, 33.5), (4.0, 45.5), (8.0, 59.2), (16.0, 84.1), (32.0, 120.3)],
    "graphs p50": [(1.0, 10.0), (2.0, 12.0), (4.0, 15.0), (8.0, 22.0), (16.0, 35.0)],
    "graphs p99": [(1.0, 12.0), (2.0, 14.0), (4.0, 18.0), (8.0, 25.0), (16.0, 40.0)],
}


def polylines(path: Path) -> list[ET.Element]:
    """The drawn series of a chart file (which must parse as XML)."""
    return ET.parse(path).getroot().findall(f"{SVG}polyline")


def by_class(root: ET.Element, tag: str, name: str) -> list[ET.Element]:
    """The elements ``tag`` anywhere under ``root`` whose class is ``name``."""
    return [e for e in root.iter(f"{SVG}{tag}") if e.get("class") == name]


def rect_box(rect: ET.Element) -> Box:
    """The box of an SVG rect."""
    x, y = float(rect.get("x", "0")), float(rect.get("y", "0"))
    return x, y, x + float(rect.get("width", "0")), y + float(rect.get("height", "0"))


def plot_area(root: ET.Element) -> Box:
    """The frame the data is drawn in."""
    (frame,) = by_class(root, "rect", "plot-area")
    return rect_box(frame)


def text_box(text: ET.Element, default_size: float) -> Box:
    """The estimated box of a text element: GLYPH_EM per character, ASCENT_EM/DESCENT_EM
    around the baseline, placed by text-anchor and turned by a rotate(a cx cy) transform."""
    size = float(text.get("font-size", default_size))
    width = len(text.text or "") * size * GLYPH_EM
    x, baseline = float(text.get("x", "0")), float(text.get("y", "0"))
    left = x - {"start": 0.0, "middle": width / 2, "end": width}[text.get("text-anchor", "start")]
    top, bottom = baseline - size * ASCENT_EM, baseline + size * DESCENT_EM
    corners = [(left, top), (left + width, top), (left, bottom), (left + width, bottom)]
    turn = re.fullmatch(r"rotate\((\S+) (\S+) (\S+)\)", text.get("transform", "rotate(0 0 0)"))
    assert turn is not None, text.get("transform")
    angle, cx, cy = (float(g) for g in turn.groups())
    cos, sin = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    turned = [(cx + (px - cx) * cos - (py - cy) * sin, cy + (px - cx) * sin + (py - cy) * cos)
              for px, py in corners]
    return (min(p[0] for p in turned), min(p[1] for p in turned),
            max(p[0] for p in turned), max(p[1] for p in turned))


def overlap(a: Box, b: Box) -> bool:
    """Whether two boxes share any area."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def inside(inner: Box, outer: Box) -> bool:
    """Whether ``inner`` lies within ``outer``."""
    return (outer[0] <= inner[0] and inner[2] <= outer[2]
            and outer[1] <= inner[1] and inner[3] <= outer[3])


def drawn_points(root: ET.Element) -> list[tuple[float, float]]:
    """Every vertex of every series, and every dot, in SVG pixels."""
    points = [tuple(map(float, pair.split(",")))
              for line in root.findall(f"{SVG}polyline")
              for pair in (line.get("points") or "").split()]
    dots = [(float(c.get("cx", "nan")), float(c.get("cy", "nan")))
            for c in root.iter(f"{SVG}circle")]
    return [(p[0], p[1]) for p in points] + dots


def segments(root: ET.Element) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """The straight pieces of every series, in SVG pixels."""
    out = []
    for line in root.findall(f"{SVG}polyline"):
        vertices = [tuple(map(float, pair.split(","))) for pair in
                    (line.get("points") or "").split()]
        out += [((a[0], a[1]), (b[0], b[1])) for a, b in itertools.pairwise(vertices)]
    return out


def segment_meets_box(a: tuple[float, float], b: tuple[float, float], box: Box) -> bool:
    """Whether the segment a-b passes through ``box``, by sampling it finely (a check that
    does not share the chart's own clipping code)."""
    steps = 400
    return any(box[0] <= a[0] + (b[0] - a[0]) * i / steps <= box[2]
               and box[1] <= a[1] + (b[1] - a[1]) * i / steps <= box[3]
               for i in range(steps + 1))


def tick_values(root: ET.Element, axis: str) -> list[float]:
    """The numbers written under (x) or beside (y) the frame, in drawing order."""
    return [float(t.text or "nan") for t in by_class(root, "text", f"{axis}-tick")]


def test_cdf_is_monotonic_and_ends_at_one() -> None:
    """Sorted values, fractions rising to 1, at most the asked number of points."""
    points = cdf([5.0, 1.0, 3.0, 2.0, 4.0])
    assert points == [(1.0, 0.2), (2.0, 0.4), (3.0, 0.6), (4.0, 0.8), (5.0, 1.0)]
    many = cdf([float(i) for i in range(10_000)], points=100)
    assert len(many) <= 102 and many[-1] == (9999.0, 1.0)
    assert all(a[0] <= b[0] and a[1] < b[1] for a, b in itertools.pairwise(many))
    assert cdf([]) == []


def test_chart_has_a_line_per_series_inside_the_plot(tmp_path: Path) -> None:
    """Each non-empty series is one polyline whose points lie inside the SVG."""
    path = write_chart(tmp_path / "c.svg", Chart(
        title="t <&>", x_label="x", y_label="y", log_x=True,
        series={"a": cdf([0.3, 1.0, 40.0]), "b": cdf([2.0, 900.0]), "empty": []},
        reference=(0.5, "half")))
    root = ET.parse(path).getroot()
    lines = polylines(path)
    assert [line.findtext(f"{SVG}title") for line in lines] == ["a", "b"]
    width, height = float(root.get("width", "0")), float(root.get("height", "0"))
    for x, y in drawn_points(root):
        assert 0 <= x <= width and 0 <= y <= height
    assert "t &lt;&amp;&gt;" in path.read_text()


def test_linear_chart_with_one_point_and_a_reference(tmp_path: Path) -> None:
    """A single point is drawn as a dot; the reference line gets its label."""
    path = write_chart(tmp_path / "s.svg", Chart(
        title="steps", x_label="batch", y_label="ms", series={"p99": [(1.0, 12.0)]},
        reference=(80.0, "budget 80 ms")))
    root = ET.parse(path).getroot()
    assert len(root.findall(f"{SVG}circle")) == 1
    assert [t.text for t in by_class(root, "text", "reference-label")] == ["budget 80 ms"]


@pytest.mark.parametrize("budget", [130.0, 80.0, 40.0, 0.0])
def test_reference_label_clears_the_legend_and_every_other_text(tmp_path: Path,
                                                                 budget: float) -> None:
    """The reference label lies inside the plot area, the legend's box outside it; no two texts of
    the chart (title, axis names, tick labels, legend entries, reference label) overlap, and
    only legend entries lie on the legend's box."""
    path = write_chart(tmp_path / "w.svg", Chart(
        title="bench worker: moshi step time by batch size", x_label="batch (sessions per step)",
        y_label="step time (ms)", series=WORKER_SERIES, integer_x=True,
        reference=(budget, f"budget {budget:g} ms")))
    root = ET.parse(path).getroot()
    size = float(root.get("font-size", "0"))
    (legend,) = [rect_box(r) for r in by_class(root, "rect", "legend-box")]
    (label,) = [text_box(t, size) for t in by_class(root, "text", "reference-label")]
    assert inside(label, plot_area(root))
    assert not overlap(label, legend) and not overlap(legend, plot_area(root))
    texts = [(t.get("class"), text_box(t, size)) for t in root.iter(f"{SVG}text")]
    for (kind_a, a), (kind_b, b) in itertools.combinations(texts, 2):
        assert not overlap(a, b), (kind_a, a, kind_b, b)
    for kind, box in texts:
        assert inside(box, legend) if kind == "legend-entry" else not overlap(box, legend), kind


def test_reference_label_moves_off_the_data(tmp_path: Path) -> None:
    """With data just above and just below the line's left part, the label goes where no
    series passes through it."""
    path = write_chart(tmp_path / "r.svg", Chart(
        title="t", x_label="x", y_label="y", reference=(50.0, "target 50 ms"),
        series={"above": [(0.0, 52.0), (5.0, 52.0)], "below": [(0.0, 48.0), (5.0, 48.0)],
                "late": [(6.0, 1.0), (10.0, 2.0)]}))
    root = ET.parse(path).getroot()
    (label,) = [text_box(t, 12.0) for t in by_class(root, "text", "reference-label")]
    assert inside(label, plot_area(root))
    assert not any(segment_meets_box(a, b, label) for a, b in segments(root))


@pytest.mark.parametrize(("series", "integer_x"), [
    ({"p50": [(1.0, 3.0), (2.0, 4.0)]}, False),  # a span of one batch: 0.2 steps otherwise
    ({"p50": [(1.0, 3.0), (2.0, 4.0), (4.0, 5.0), (8.0, 9.5), (16.0, 12.0), (32.0, 20.0)]}, False),
    ({"p50": [(3.0, 7.5)]}, False),
    ({"mean": [(1.0, 3.0), (1.5, 4.0), (2.5, 5.0)]}, True),  # declared, though not all whole
])
def test_integer_x_axis_has_whole_number_ticks(tmp_path: Path,
                                               series: dict[str, list[tuple[float, float]]],
                                               integer_x: bool) -> None:
    """Batch sizes (all whole, or declared so) get whole-number x ticks, at least two."""
    path = write_chart(tmp_path / "i.svg", Chart(title="t", x_label="batch", y_label="ms",
                                                  series=series, integer_x=integer_x))
    ticks = tick_values(ET.parse(path).getroot(), "x")
    assert len(ticks) >= 2
    assert all(t.is_integer() for t in ticks), ticks


def test_integer_y_axis_has_whole_number_ticks(tmp_path: Path) -> None:
    """Counts on the y axis (all whole) get whole-number y ticks only."""
    path = write_chart(tmp_path / "y.svg", Chart(
        title="t", x_label="s", y_label="sessions", series={"open": [(0.5, 0.0), (1.5, 2.0)]}))
    root = ET.parse(path).getroot()
    ticks = tick_values(root, "y")
    assert len(ticks) >= 2 and all(t.is_integer() for t in ticks), ticks
    assert not all(t.is_integer() for t in tick_values(root, "x"))  # x stays fractional


@pytest.mark.parametrize(("low", "high"), [(0.1, 1.0), (3.0, 97.5), (-0.004, 0.013), (7.0, 7.6)])
def test_linear_ticks_are_even_1_2_5_steps(tmp_path: Path, low: float, high: float) -> None:
    """Linear ticks are evenly spaced by 1, 2 or 5 times a power of ten, three to eight of
    them, all within the frame."""
    path = write_chart(tmp_path / "n.svg", Chart(
        title="t", x_label="x", y_label="y", series={"a": [(low, 1.0), (high, 1.0)]}))
    ticks = tick_values(ET.parse(path).getroot(), "x")
    assert 3 <= len(ticks) <= 8, ticks
    steps = {round(b - a, 12) for a, b in itertools.pairwise(ticks)}
    assert len(steps) == 1, ticks
    (step,) = steps
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, m) for m in (1, 2, 5)), step


@pytest.mark.parametrize(("series", "log_x"), [
    ({"one": [(4.0, 12.0)]}, False),
    ({"one": [(4.0, 12.0)]}, True),
    ({"flat": [(2.0, 5.0), (2.0, 5.0), (2.0, 5.0)]}, False),
    ({"zero": [(0.0, 0.0), (0.0, 0.0)]}, False),
    ({"a": [(1.0, 20.0), (2.0, 31.0), (32.0, 96.0)], "b": [(1.0, 0.0), (32.0, 10.0)]}, False),
    ({"neg": [(-5.0, -3.0), (5.0, 3.0)]}, False),
    ({"cdf": cdf([0.01, 0.2, 3.0, 40.0, 900.0])}, True),
    ({"decade": [(1.0, 1.0), (10.0, 2.0), (100.0, 3.0)]}, True),
])
def test_every_point_lies_strictly_inside_the_plot_area(
        tmp_path: Path, series: dict[str, list[tuple[float, float]]], log_x: bool) -> None:
    """No vertex or dot sits on the frame or outside it, and each axis keeps two ticks or more:
    a single point, equal points, points at zero, a normal series, negatives, and log axes
    whose data ends on a decade."""
    path = write_chart(tmp_path / "p.svg", Chart(title="t", x_label="x", y_label="y",
                                                  series=series, log_x=log_x))
    root = ET.parse(path).getroot()
    left, top, right, bottom = plot_area(root)
    points = drawn_points(root)
    assert points
    for x, y in points:
        assert left < x < right and top < y < bottom, (x, y)
    assert len(tick_values(root, "x")) >= 2 and len(tick_values(root, "y")) >= 2


def test_log_axis_keeps_decade_ticks(tmp_path: Path) -> None:
    """Values spanning 0.01 to 900 get one tick per decade inside the (padded) frame, equally
    spaced on the page."""
    path = write_chart(tmp_path / "l.svg", Chart(
        title="t", x_label="ms", y_label="fraction", log_x=True,
        series={"a": cdf([0.01, 0.5, 3.0, 40.0, 900.0])}))
    root = ET.parse(path).getroot()
    assert tick_values(root, "x") == [0.01, 0.1, 1.0, 10.0, 100.0, 1000.0]
    at = [float(t.get("x", "nan")) for t in by_class(root, "text", "x-tick")]
    gaps = [b - a for a, b in itertools.pairwise(at)]
    assert max(gaps) - min(gaps) <= 0.2  # pixels, from rounding to one decimal


def test_many_decades_thin_their_labels_and_a_short_log_axis_still_has_ticks(
        tmp_path: Path) -> None:
    """Fifteen decades are labelled every other decade (no crowding); data within one decade
    still gets at least two ticks."""
    wide = write_chart(tmp_path / "w.svg", Chart(
        title="t", x_label="x", y_label="y", log_x=True,
        series={"a": [(1e-5, 0.0), (1e9, 1.0)]}))
    ticks = tick_values(ET.parse(wide).getroot(), "x")
    assert 2 <= len(ticks) <= 8 and ticks[0] == 1e-5
    exponents = [round(math.log10(t)) for t in ticks]
    assert {b - a for a, b in itertools.pairwise(exponents)} == {2}
    short = write_chart(tmp_path / "s.svg", Chart(
        title="t", x_label="x", y_label="y", log_x=True, series={"a": [(2.0, 0.0), (8.0, 1.0)]}))
    assert len(tick_values(ET.parse(short).getroot(), "x")) >= 2


def test_hostile_text_is_escaped_and_the_file_stays_valid(tmp_path: Path) -> None:
    """Markup characters, quotes and characters XML forbids in names and labels leave a file
    that parses, showing the text as written (forbidden characters dropped)."""
    hostile = "a<b>&\"c' \x01d"
    path = write_chart(tmp_path / "h.svg", Chart(
        title=hostile, x_label=hostile, y_label=hostile, series={hostile: [(1.0, 2.0)]},
        reference=(3.0, hostile)))
    root = ET.parse(path).getroot()
    shown = "a<b>&\"c' d"
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert texts.count(shown) == 5  # title, two axis names, reference label, legend entry
    assert root.findtext(f"{SVG}polyline/{SVG}title") == shown


def test_nothing_to_draw_or_a_bad_value_is_refused(tmp_path: Path) -> None:
    """An empty chart, a non-positive x on a log axis or a value that is not finite raises
    ValueError."""
    with pytest.raises(ValueError, match="no points"):
        write_chart(tmp_path / "e.svg", Chart(title="", x_label="", y_label="", series={}))
    with pytest.raises(ValueError, match="log axis"):
        write_chart(tmp_path / "l.svg", Chart(title="", x_label="", y_label="", log_x=True,
                                              series={"a": [(0.0, 1.0)]}))
    with pytest.raises(ValueError, match="finite"):
        write_chart(tmp_path / "n.svg", Chart(title="", x_label="", y_label="",
                                              series={"a": [(1.0, math.nan)]}))
