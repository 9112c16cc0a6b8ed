"""The chart lints and renders for every values profile; bad values are refused, with a reason.

Refusals come from two places: values.schema.json (types, ranges, unknown keys) and the
chart's own checks of relations the schema cannot state (grace periods, paths).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helm.render import CHART, PROFILES, Rendered, RenderError, helm, helm_errors, render

#: The four profiles the issue asks for, under the chart's ci/ folder.
EXPECTED_PROFILES = {"minimal", "bundled-monitoring", "cluster-autoscaling", "sentinel-secrets"}
#: The oldest and newest Kubernetes the chart is validated against (tests/helm).
KUBE_FLOOR, KUBE_CEILING = "1.29.0", "1.37.0"


def test_the_four_profiles_are_there() -> None:
    """ci/ holds exactly the profiles the chart is proven with."""
    assert set(PROFILES) == EXPECTED_PROFILES


@pytest.mark.parametrize("profile", sorted(EXPECTED_PROFILES))
def test_helm_lint_strict_passes(profile: str) -> None:
    """`helm lint --strict` with each profile: no error and no warning."""
    result = helm("lint", "--strict", str(CHART), "--values", str(PROFILES[profile]))
    assert result.returncode == 0, result.stdout + helm_errors(result.stderr)
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


@pytest.mark.parametrize("profile", sorted(EXPECTED_PROFILES))
def test_helm_template_renders_the_core_objects(profile: str) -> None:
    """Each profile renders the gateway and worker Deployments, their ConfigMaps and the
    gateway's Service."""
    rendered = render(profile=profile)
    for kind, component in [("Deployment", "gateway"), ("Deployment", "worker"),
                            ("ConfigMap", "gateway"), ("ConfigMap", "worker"),
                            ("Service", "gateway")]:
        rendered.component(kind, component)


@pytest.mark.parametrize(("values", "complaint"), [
    ({"gateway": {"replicas": -1}}, "gateway.replicas: Must be greater than or equal to 0"),
    ({"worker": {"replicas": -2}}, "worker.replicas: Must be greater than or equal to 0"),
    ({"gateway": {"replicaCount": 3}}, "Additional property replicaCount is not allowed"),
    ({"unknownTopLevel": True}, "Additional property unknownTopLevel is not allowed"),
    ({"gateway": {"settings": {"idle_ttl": 5}}}, "Additional property idle_ttl is not allowed"),
    ({"gateway": {"port": "8000"}}, "gateway.port: Invalid type. Expected: integer"),
    ({"worker": {"slots": 0}}, "worker.slots: Must be greater than or equal to 1"),
    ({"worker": {"dtype": "int8"}}, "worker.dtype"),
    ({"gateway": {"settings": {"idle_ttl_s": 0}}}, "gateway.settings.idle_ttl_s: Must be greater"),
    ({"worker": {"settings": {"tick_budget_fraction": 1.5}}},
     "worker.settings.tick_budget_fraction: Must be less than or equal to 1"),
    ({"monitoring": {"serviceMonitor": {"enabled": "yes"}}}, "monitoring.serviceMonitor.enabled"),
    ({"redis": {"mode": "external", "external": {"url": "redis://:secret@redis:6379/0"}}},
     "redis.external.url: Does not match pattern"),
    ({"redis": {"mode": "external"}}, "redis.external.url: String length must be greater"),
    ({"redis": {"mode": "sentinel"}}, "redis.sentinel.hosts: Array must have at least 1"),
    ({"apiKeys": {"create": True}}, "apiKeys.keys: Array must have at least 1"),
    ({"worker": {"model": {"volume": {"type": "persistentVolumeClaim"}}}},
     "worker.model.volume.claimName: String length must be greater"),
    ({"workerPools": [{"name": "a", "replica": 2}]}, "Additional property replica is not allowed"),
    ({"workerPools": [{"name": "a", "gpu": {"counts": 1}}]},
     "workerPools.0.gpu: Additional property counts is not allowed"),
    ({"workerPools": [{"name": "a", "slots": 0}]},
     "workerPools.0.slots: Must be greater than or equal to 1"),
    ({"workerPools": [{"name": "a", "models": ["ok", "not ok"]}]},
     "workerPools.0.models.1: Does not match pattern"),
    ({"workerPools": [{"name": "a", "models": ["-dash"]}]}, "workerPools.0.models.0"),
    ({"workerPools": [{"name": "a", "models": ["m", "m"]}]}, "workerPools.0.models: array items"),
    ({"workerPools": [{"name": "a", "models": [f"m{i}" for i in range(17)]}]},
     "workerPools.0.models: Array must have at most 16 items"),
    ({"workerPools": [{"models": ["m"]}]}, "workerPools.0: name is required"),
    ({"workerPools": [{"name": "GPU"}]}, "workerPools.0.name: Does not match pattern"),
    ({"workerPools": [{"name": "a" * 21}]}, "workerPools.0.name: Does not match pattern"),
    ({"workerPools": []}, "workerPools: Array must have at least 1 items"),
    ({"gateway": {"settings": {"default_model": "a b"}}},
     "gateway.settings.default_model: Does not match pattern"),
])
def test_the_schema_refuses_a_bad_value(values: dict[str, Any], complaint: str) -> None:
    """A negative count, an unknown key, a wrong type, a value out of the code's range, a
    password in a URL or a mode without its address is refused, naming the value."""
    with pytest.raises(RenderError, match="schema") as refused:
        render(values)
    assert complaint in str(refused.value)


@pytest.mark.parametrize(("values", "complaint"), [
    ({"gateway": {"drain": {"preStopSeconds": 20, "terminationGracePeriodSeconds": 25}}},
     "must exceed gateway.drain.preStopSeconds (20) plus the gateway's 5s shutdown"),
    ({"worker": {"drainTimeoutSeconds": 60, "terminationGracePeriodSeconds": 60}},
     'worker pool "default": terminationGracePeriodSeconds (60) must exceed drainTimeoutSeconds'
     " (60)"),
    ({"gateway": {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 3}}},
     "minReplicas must not exceed"),
    ({"worker": {"model": {"path": "/weights/moshi", "volume": {
        "type": "hostPath", "hostPath": "/srv/models"}}}},
     'worker pool "default": model.path ("/weights/moshi") must be inside model.mountPath'),
    ({"networkPolicy": {"enabled": True, "ingressFrom": []}}, "networkPolicy.ingressFrom is empty"),
    ({"workerPools": [{"name": "a"}, {"name": "b"}, {"name": "a"}]},
     'workerPools: two pools are named "a"'),
    ({"worker": {"drainTimeoutSeconds": 10},
      "workerPools": [{"name": "a"}, {"name": "b", "terminationGracePeriodSeconds": 10}]},
     'worker pool "b": terminationGracePeriodSeconds (10) must exceed drainTimeoutSeconds (10)'),
    ({"workerPools": [{"name": "a", "model": {"volume": {"type": "persistentVolumeClaim"}}}]},
     'worker pool "a": model.volume.claimName is empty'),
    ({"workerPools": [{"name": "a", "model": {"volume": {"type": "hostPath"}}}]},
     'worker pool "a": model.volume.hostPath ("") must be an absolute path'),
    ({"workerPools": [{"name": "a", "autoscaling": {"enabled": True}}]},
     'worker pool "a": autoscaling needs resources.requests.cpu'),
    ({"worker": {"autoscaling": {"minReplicas": 3}},
      "workerPools": [{"name": "a", "autoscaling": {"maxReplicas": 2}}]},
     'worker pool "a": autoscaling.minReplicas must not exceed autoscaling.maxReplicas'),
])
def test_the_chart_refuses_values_that_contradict(values: dict[str, Any], complaint: str) -> None:
    """Relations the schema cannot state are refused with a sentence naming both values."""
    with pytest.raises(RenderError) as refused:
        render(values)
    assert complaint in str(refused.value)


def test_helm_lint_checks_worker_pools(tmp_path: Path) -> None:
    """`helm lint --strict` passes two well-formed pools and refuses an unknown key in one."""
    good = {"workerPools": [{"name": "alpha", "models": ["alpha"]},
                            {"name": "beta", "models": ["beta", "beta-latest"],
                             "backend": "fake"}]}
    bad = {"workerPools": [{"name": "alpha", "models": ["alpha"], "gpus": 1}]}
    outcomes = []
    for values in (good, bad):
        path = tmp_path / "values.yaml"
        path.write_text(json.dumps(values))
        outcomes.append(helm("lint", "--strict", str(CHART), "--values", str(path)))
    assert outcomes[0].returncode == 0, outcomes[0].stdout + helm_errors(outcomes[0].stderr)
    assert "[WARNING]" not in outcomes[0].stdout
    assert outcomes[1].returncode != 0
    assert "Additional property gpus is not allowed" in outcomes[1].stdout + outcomes[1].stderr


def test_the_chart_refuses_a_kubernetes_older_than_its_floor() -> None:
    """kubeVersion: 1.28 is refused; the floor and the newest validated version render."""
    with pytest.raises(RenderError, match="kubeVersion"):
        render(kube_version="1.28.0")
    for version in (KUBE_FLOOR, KUBE_CEILING):
        assert isinstance(render(kube_version=version), Rendered)
