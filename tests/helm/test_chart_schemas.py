"""Every rendered object validates strictly against the schemas of the API that will read it.

Core objects: kubernetes-validate's strict schemas (unknown fields refused) of the oldest and
newest Kubernetes the chart supports; an object whose schema is not found fails. The
prometheus-operator's ServiceMonitor and PrometheusRule: its pydantic models, strict, and the
object read back from the model must equal the rendered one (so no field was unknown to it);
the rules inside the PrometheusRule must pass ``promtool check rules``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml  # type: ignore[import-untyped]
from cloudcoil.models.prometheus_operator.v1 import PrometheusRule, ServiceMonitor
from pydantic import BaseModel

from tests.helm.render import MONITORING_APIS, PROFILES, ROOT, Rendered, render

#: The oldest and newest Kubernetes the chart supports: Chart.yaml's kubeVersion floor, and
#: the newest version kubernetes-validate ships schemas for.
KUBE_VERSIONS = ("1.29", "1.37")
OPERATOR_MODELS: dict[str, type[BaseModel]] = {"ServiceMonitor": ServiceMonitor,
                                               "PrometheusRule": PrometheusRule}
PROMTOOL = ROOT / ".deps" / "prometheus" / "usr" / "bin" / "promtool"


def rendered_with_monitoring(profile: str) -> Rendered:
    """A profile rendered as on a cluster with the operator's CRDs (auto toggles on)."""
    return render(profile=profile, api_versions=MONITORING_APIS)


def test_the_versions_are_the_charts_floor_and_the_newest_schemas() -> None:
    """The floor is Chart.yaml's kubeVersion; the ceiling the newest schemas shipped."""
    chart = yaml.safe_load((ROOT / "helm" / "duplex-gateway" / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={KUBE_VERSIONS[0]}.0-0"
    assert kubernetes_validate.latest_version().startswith(KUBE_VERSIONS[1])


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_core_objects_validate_strictly(profile: str, version: str) -> None:
    """Every object but the operator's validates in strict mode; a schema not found is a
    failure (SchemaNotFoundError propagates), not a warning."""
    core = [obj for obj in rendered_with_monitoring(profile).objects
            if obj["kind"] not in OPERATOR_MODELS]
    assert core
    for obj in core:
        try:
            validated = kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(part) for part in error.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} at {where}: {error.message}")
        assert validated == version


def test_strict_validation_refuses_an_unknown_field() -> None:
    """The check can fail: a field Kubernetes does not know is refused in strict mode."""
    deployment = render().component("Deployment", "gateway")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[0], strict=True)


def operator_objects(profile: str) -> list[dict[str, Any]]:
    return [obj for obj in rendered_with_monitoring(profile).objects
            if obj["kind"] in OPERATOR_MODELS]


def read_back(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` through the operator's model, strictly, and out again: a field the model does
    not know is dropped, so the result differs from ``obj``."""
    model = OPERATOR_MODELS[obj["kind"]].model_validate(obj, strict=True)
    return model.model_dump(by_alias=True, exclude_unset=True, mode="json")


@pytest.mark.parametrize("profile", ["minimal", "bundled-monitoring"])
def test_servicemonitors_and_the_prometheusrule_match_the_operator_models(profile: str) -> None:
    """Both ServiceMonitors and the PrometheusRule validate against the prometheus-operator
    models and keep every field (none unknown to the operator)."""
    objects = operator_objects(profile)
    assert sorted(obj["kind"] for obj in objects) == ["PrometheusRule", "ServiceMonitor",
                                                      "ServiceMonitor"]
    for obj in objects:
        assert read_back(obj) == obj, f"{obj['kind']}/{obj['metadata']['name']}"


def test_the_operator_check_can_fail() -> None:
    """A field the operator does not know, or a wrong type, is caught."""
    (monitor, *_) = [obj for obj in operator_objects("minimal")
                     if obj["kind"] == "ServiceMonitor"]
    monitor["spec"]["endpoints"][0]["scrapeEvery"] = "30s"
    assert read_back(monitor) != monitor
    monitor["spec"]["endpoints"][0] = {"port": 9090}
    with pytest.raises(ValueError, match="port"):
        read_back(monitor)


def promtool() -> Path:
    """promtool, unpacked by scripts/fetch-prometheus (run here if it has not been)."""
    if shutil.which("promtool"):
        return Path(str(shutil.which("promtool")))
    if not PROMTOOL.is_file():
        subprocess.run([str(ROOT / "scripts" / "fetch-prometheus")], check=True,
                       capture_output=True, timeout=300)
    return PROMTOOL


def test_promtool_accepts_the_rules_of_the_rendered_prometheusrule(tmp_path: Path) -> None:
    """The rendered PrometheusRule's spec, written out as a rule file, passes promtool."""
    (rule,) = [obj for obj in operator_objects("bundled-monitoring")
               if obj["kind"] == "PrometheusRule"]
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule["spec"]))
    result = subprocess.run([str(promtool()), "check", "rules", str(rules)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
