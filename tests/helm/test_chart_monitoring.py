"""Monitoring objects: one source of truth in deploy/, job labels the rules select, and the
"auto" toggles following the cluster's APIs."""

from __future__ import annotations

import re

import pytest
import yaml  # type: ignore[import-untyped]

from tests.helm.render import CHART, MONITORING_APIS, ROOT, Rendered, render

ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "duplex-gateway.json"
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}


def monitoring_objects(rendered: Rendered) -> set[str]:
    """The kinds of the rendered monitoring objects ("ConfigMap" for the dashboard)."""
    kinds = {obj["kind"] for obj in rendered.objects if obj["kind"] in OPERATOR_KINDS}
    dashboards = [obj for obj in rendered.of_kind("ConfigMap")
                  if obj["metadata"]["labels"]["app.kubernetes.io/component"] == "dashboard"]
    return kinds | ({"dashboard"} if dashboards else set())


def test_the_chart_reads_the_files_in_deploy() -> None:
    """The chart's rule file and dashboard are links to deploy/, not copies that could drift."""
    for name, source in [("alerts.yaml", ALERTS), ("duplex-gateway.json", DASHBOARD)]:
        link = CHART / "files" / name
        assert link.is_symlink(), f"{link} must link to {source}"
        assert link.resolve() == source.resolve()


def test_the_prometheusrule_is_the_rule_file_unchanged() -> None:
    """The rendered PrometheusRule's spec equals deploy/prometheus/alerts.yaml, rule by rule."""
    rule = render({"monitoring": {"prometheusRule": {"enabled": True}}}).component(
        "PrometheusRule", "alerts")
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())


def test_the_dashboard_configmap_is_the_dashboard_file_unchanged() -> None:
    """The dashboard ConfigMap carries deploy/grafana/duplex-gateway.json byte for byte, with
    the sidecar's label."""
    dashboard = render({"monitoring": {"grafanaDashboard": {"enabled": True}}}).component(
        "ConfigMap", "dashboard")
    assert dashboard["data"] == {"duplex-gateway.json": DASHBOARD.read_text()}
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_the_servicemonitors_give_the_jobs_the_rules_select() -> None:
    """Every job the alert rules select is the job label a ServiceMonitor sets, and each
    ServiceMonitor selects a Service of its component with the port it scrapes."""
    rendered = render({"monitoring": {"serviceMonitor": {"enabled": True}}})
    jobs = {}
    for monitor in rendered.of_kind("ServiceMonitor"):
        (endpoint,) = monitor["spec"]["endpoints"]
        (relabel,) = endpoint["relabelings"]
        assert (relabel["action"], relabel["targetLabel"]) == ("replace", "job")
        selector = monitor["spec"]["selector"]["matchLabels"]
        services = [service for service in rendered.of_kind("Service")
                    if selector.items() <= service["metadata"]["labels"].items()]
        assert len(services) == 1, monitor["metadata"]["name"]
        ports = {port["name"] for port in services[0]["spec"]["ports"]}
        assert endpoint["port"] in ports
        jobs[relabel["replacement"]] = selector["app.kubernetes.io/component"]
    selected = set(re.findall(r'job="([^"]+)"', ALERTS.read_text()))
    assert selected == set(jobs) == {"duplex-gateway", "duplex-worker"}
    assert jobs == {"duplex-gateway": "gateway", "duplex-worker": "worker"}


@pytest.mark.parametrize(("api_versions", "expected"), [
    ((), set()),
    (MONITORING_APIS, {"ServiceMonitor", "PrometheusRule", "dashboard"}),
    (("monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor"),
     {"ServiceMonitor", "dashboard"}),
])
def test_auto_follows_the_clusters_apis(api_versions: tuple[str, ...], expected: set[str]) -> None:
    """With "auto" each object is rendered only when the cluster serves its kind."""
    assert monitoring_objects(render(api_versions=api_versions)) == expected


def test_explicit_toggles_win_over_the_apis() -> None:
    """true renders without the CRDs; false renders nothing even with them."""
    on = {"enabled": True}
    off = {"enabled": False}
    assert monitoring_objects(render({"monitoring": {
        "serviceMonitor": on, "prometheusRule": on, "grafanaDashboard": on}})) == {
        "ServiceMonitor", "PrometheusRule", "dashboard"}
    assert monitoring_objects(render({"monitoring": {
        "serviceMonitor": off, "prometheusRule": off, "grafanaDashboard": off}},
        api_versions=MONITORING_APIS)) == set()
