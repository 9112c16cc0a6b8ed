"""The benchmarks' SVG charts: well-formed, one line per series, axes that fit the data."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from duplex_gateway.svgplot import Chart, cdf, write_chart

SVG = "{http://www.w3.org/2000/svg}"


def polylines(path: Path) -> list[ET.Element]:
    """The drawn series of a chart file (which must parse as XML)."""
    return ET.parse(path).getroot().findall(f"{SVG}polyline")


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
    lines = polylines(path)
    assert [line.findtext(f"{SVG}title") for line in lines] == ["a", "b"]
    for line in lines:
        for pair in (line.get("points") or "").split():
            x, y = map(float, pair.split(","))
            assert 0 <= x <= 720 and 0 <= y <= 450
    assert "t &lt;&amp;&gt;" in path.read_text()


def test_linear_chart_with_one_point_and_a_reference(tmp_path: Path) -> None:
    """A single point is drawn as a dot; the reference line gets its label."""
    path = write_chart(tmp_path / "s.svg", Chart(
        title="steps", x_label="batch", y_label="ms", series={"p99": [(1.0, 12.0)]},
        reference=(80.0, "budget 80 ms")))
    root = ET.parse(path).getroot()
    assert len(root.findall(f"{SVG}circle")) == 1
    assert "budget 80 ms" in path.read_text()


def test_nothing_to_draw_or_a_bad_log_axis_is_refused(tmp_path: Path) -> None:
    """An empty chart or a non-positive x on a log axis raises ValueError."""
    with pytest.raises(ValueError, match="no points"):
        write_chart(tmp_path / "e.svg", Chart(title="", x_label="", y_label="", series={}))
    with pytest.raises(ValueError, match="log axis"):
        write_chart(tmp_path / "l.svg", Chart(title="", x_label="", y_label="", log_x=True,
                                              series={"a": [(0.0, 1.0)]}))
