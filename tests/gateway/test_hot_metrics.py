"""The hot-path counter and histogram export what prometheus_client's own types export."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.metrics import GatewayMetrics, HotCounter, HotHistogram

BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024)
# Amounts on and around every bound (a bound is inclusive), below the first, past the last.
AMOUNTS = st.one_of(st.sampled_from([0.0, *BUCKETS, 2.0]),
                    st.floats(min_value=0.0, max_value=5.0, allow_nan=False))
_CREATED = re.compile(r"^(\S+_created(?:\{[^}]*\})?) \S+$")


def exposition(registry: CollectorRegistry) -> list[str]:
    """The registry's text format, each ``_created`` sample's time left out (it differs)."""
    return [_CREATED.sub(r"\1 <time>", line)
            for line in generate_latest(registry).decode().splitlines()]


@given(amounts=st.lists(st.tuples(st.sampled_from(["in", "out"]), AMOUNTS), max_size=40))
def test_hot_histogram_exports_what_a_histogram_does(amounts: list[tuple[str, float]]) -> None:
    hot_registry, reference_registry = CollectorRegistry(), CollectorRegistry()
    hot = HotHistogram("relay_seconds", "help text", "direction", ("in", "out"), BUCKETS,
                       hot_registry)
    reference = Histogram("relay_seconds", "help text", ["direction"], buckets=BUCKETS,
                          registry=reference_registry)
    for direction in ("in", "out"):
        reference.labels(direction=direction)
    for direction, amount in amounts:
        hot.labels(direction).observe(amount)
        reference.labels(direction=direction).observe(amount)
    assert exposition(hot_registry) == exposition(reference_registry)


@given(amounts=st.lists(st.integers(min_value=0, max_value=300), max_size=20))
def test_hot_counter_exports_what_a_counter_does(amounts: list[int]) -> None:
    hot_registry, reference_registry = CollectorRegistry(), CollectorRegistry()
    hot = HotCounter("frames_sent", "help text", hot_registry)
    reference = Counter("frames_sent", "help text", registry=reference_registry)
    for amount in amounts:
        hot.inc(amount)
        reference.inc(amount)
    assert exposition(hot_registry) == exposition(reference_registry)


def test_the_gateways_hot_metrics_are_on_its_registry() -> None:
    """The relay's counts reach the gateway's scrape, under their documented names."""
    metrics = GatewayMetrics()
    metrics.frames_sent.inc()
    metrics.commands_appended.inc(3)
    metrics.relay_seconds.labels("out").observe(0.003)
    text = "\n".join(exposition(metrics.registry))
    assert "duplex_gateway_frames_sent_total 1.0" in text
    assert "duplex_gateway_commands_appended_total 3.0" in text
    assert 'duplex_gateway_relay_seconds_bucket{direction="out",le="0.004"} 1.0' in text
    assert 'duplex_gateway_relay_seconds_count{direction="in"} 0.0' in text


def test_a_hot_counter_refuses_to_go_down_as_a_counter_does() -> None:
    hot = HotCounter("frames_sent", "help text", CollectorRegistry())
    reference = Counter("frames_sent", "help text", registry=CollectorRegistry())
    for counter in (hot, reference):
        with pytest.raises(ValueError):
            counter.inc(-1)
    assert hot.value == 0
