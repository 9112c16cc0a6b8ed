"""docs/reference/metrics.md lists every metric the gateway and the worker export and every
alert of deploy/prometheus/alerts.yaml, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import yaml  # type: ignore[import-untyped]
from prometheus_client import CollectorRegistry

from gateway.metrics import GatewayMetrics
from inference_worker.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "metrics.md"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
_ROW = re.compile(r"^\| `([A-Za-z_:][A-Za-z0-9_:]*)` \|", re.MULTILINE)


def _exported(registry: CollectorRegistry) -> set[str]:
    """The names a scrape shows: a counter with its ``_total``, others as they are."""
    return {family.name + ("_total" if family.type == "counter" else "")
            for family in registry.collect()}


def _alerts() -> set[str]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {rule["alert"] for group in groups for rule in group["rules"]}


def test_every_metric_and_alert_has_a_row_and_every_row_is_one() -> None:
    expected = (_exported(GatewayMetrics().registry) | _exported(WorkerMetrics("fake").registry)
                | _alerts())
    documented = _ROW.findall(PAGE.read_text())
    assert len(documented) == len(set(documented)), "a metric or alert listed twice"
    assert sorted(expected - set(documented)) == [], "exported but not in metrics.md"
    assert sorted(set(documented) - expected) == [], "in metrics.md but not exported"


def test_the_page_lists_both_namespaces_and_the_alerts() -> None:
    documented = set(_ROW.findall(PAGE.read_text()))
    assert any(name.startswith("duplex_gateway_") for name in documented)
    assert any(name.startswith("duplex_worker_") for name in documented)
    assert _alerts() <= documented
