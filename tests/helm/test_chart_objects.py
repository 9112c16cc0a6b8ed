"""What the rendered objects promise: probes, drain, autoscaling, GPUs, Redis, isolation.

Read from the manifests as a cluster would read them: selectors must match the pods' labels,
named ports must exist on the containers, and every container runs locked down.
"""

from __future__ import annotations

from typing import Any

import pytest

from duplex_gateway.cli import gateway_server_options
from gateway.settings import GatewaySettings
from tests.helm.render import PROFILES, Rendered, RenderError, render


def pod_spec(rendered: Rendered, kind: str, component: str) -> dict[str, Any]:
    return dict(rendered.component(kind, component)["spec"]["template"]["spec"])


def pod_labels(rendered: Rendered, kind: str, component: str) -> dict[str, str]:
    return dict(rendered.component(kind, component)["spec"]["template"]["metadata"]["labels"])


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def workloads(rendered: Rendered) -> list[dict[str, Any]]:
    return rendered.of_kind("Deployment") + rendered.of_kind("StatefulSet")


def test_gateway_liveness_is_healthz_and_readiness_readyz() -> None:
    """Liveness asks /healthz only (never Redis), readiness /readyz, on the container's port."""
    container = render().container("gateway")
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert ports == {"http": 8000}


def uvicorn_graceful_shutdown_seconds() -> int:
    """The ``timeout_graceful_shutdown`` the gateway's CLI passes to uvicorn."""
    seconds = gateway_server_options(GatewaySettings())["timeout_graceful_shutdown"]
    assert isinstance(seconds, int)
    return seconds


@pytest.mark.parametrize(("pre_stop", "grace"), [(10, 30), (3, 9), (25, 60)])
def test_gateway_drain_fits_its_grace_period(pre_stop: int, grace: int) -> None:
    """preStop waits the configured seconds; the configured grace period covers it and the
    gateway's own shutdown (uvicorn's graceful timeout in cli.py)."""
    rendered = render({"gateway": {"drain": {"preStopSeconds": pre_stop,
                                             "terminationGracePeriodSeconds": grace}}})
    spec = pod_spec(rendered, "Deployment", "gateway")
    (container,) = spec["containers"]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", str(pre_stop)]
    assert spec["terminationGracePeriodSeconds"] == grace
    assert grace > pre_stop + uvicorn_graceful_shutdown_seconds()


def test_the_charts_shutdown_budget_is_the_clis() -> None:
    """The chart refuses a grace period of exactly preStop + the CLI's shutdown time, so its
    shutdown budget is the CLI's, not a number that drifted."""
    shutdown = uvicorn_graceful_shutdown_seconds()
    with pytest.raises(RenderError, match="must exceed"):
        render({"gateway": {"drain": {"preStopSeconds": 10,
                                      "terminationGracePeriodSeconds": 10 + shutdown}}})
    render({"gateway": {"drain": {"preStopSeconds": 10,
                                  "terminationGracePeriodSeconds": 11 + shutdown}}})


def test_autoscaling_scales_down_slowly_and_owns_the_replica_count() -> None:
    """With autoscaling on: an autoscaling/v2 HPA on the gateway Deployment, scale-down
    limited by behavior (a few pods per period, after a window), and the Deployment leaves
    its replica count to the HPA."""
    rendered = render(profile="cluster-autoscaling")
    hpa = rendered.component("HorizontalPodAutoscaler", "gateway")
    deployment = rendered.component("Deployment", "gateway")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    scale_down = hpa["spec"]["behavior"]["scaleDown"]
    assert scale_down["stabilizationWindowSeconds"] == 600
    assert scale_down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 120}]
    assert "replicas" not in deployment["spec"]
    assert render().component("Deployment", "gateway")["spec"]["replicas"] == 2
    assert not render().of_kind("HorizontalPodAutoscaler")


def test_the_pdb_and_the_topology_spread_select_the_gateways() -> None:
    """The PodDisruptionBudget and the topology spread constraint select the gateway pods."""
    rendered = render()
    labels = pod_labels(rendered, "Deployment", "gateway")
    pdb = rendered.component("PodDisruptionBudget", "gateway")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert selects(pdb["spec"]["selector"]["matchLabels"], labels)
    (spread,) = pod_spec(rendered, "Deployment", "gateway")["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert selects(spread["labelSelector"]["matchLabels"], labels)
    assert not selects(spread["labelSelector"]["matchLabels"],
                       pod_labels(rendered, "Deployment", "worker"))


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_container_runs_locked_down(profile: str) -> None:
    """Non-root, read-only root filesystem, no privilege escalation, no capabilities, the
    runtime's seccomp profile and no service account token, in every workload."""
    for workload in workloads(render(profile=profile)):
        spec = workload["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] > 0
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}


def test_gpu_workers_request_their_gpus_and_land_on_gpu_nodes() -> None:
    """nvidia.com/gpu in requests and limits (equal), the node selector and toleration, the
    model volume mounted read-only where the model path points, and the grace period longer
    than the drain timeout."""
    rendered = render(profile="bundled-monitoring")
    spec = pod_spec(rendered, "Deployment", "worker")
    (container,) = spec["containers"]
    resources = container["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == 1
    assert resources["requests"]["memory"] == "32Gi"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    (volume,) = [v for v in spec["volumes"] if v["name"] == "model"]
    assert volume["persistentVolumeClaim"] == {"claimName": "moshi-weights", "readOnly": True}
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "model"]
    env = {variable["name"]: variable.get("value") for variable in container["env"]}
    assert env["DUPLEX_GATEWAY_MODEL_PATH"].startswith(mount["mountPath"] + "/")
    assert spec["terminationGracePeriodSeconds"] > float(env["DUPLEX_GATEWAY_DRAIN_TIMEOUT_S"])


def test_a_hostpath_model_and_no_gpus() -> None:
    """A hostPath model volume is a Directory; with gpu.count 0 no GPU is requested."""
    rendered = render(profile="sentinel-secrets")
    spec = pod_spec(rendered, "Deployment", "worker")
    (volume,) = [v for v in spec["volumes"] if v["name"] == "model"]
    assert volume["hostPath"] == {"path": "/srv/models", "type": "Directory"}
    assert "resources" not in spec["containers"][0]


def test_worker_probes_hit_its_metrics_listener() -> None:
    """The worker has no health endpoint: its startup and liveness probes GET /metrics on the
    metrics port, which it serves once its weights are loaded, on the pod's address."""
    container = render().container("worker")
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"][
        "periodSeconds"] >= 600
    assert "readinessProbe" not in container
    env = {variable["name"]: variable.get("value") for variable in container["env"]}
    assert env["DUPLEX_GATEWAY_METRICS_PORT"] == str(ports["metrics"])
    assert env["DUPLEX_GATEWAY_METRICS_HOST"] == "0.0.0.0"


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_services_select_pods_and_name_ports_they_have(profile: str) -> None:
    """Each Service selects exactly one workload's pods, and each of its target ports is a
    named port of that workload's container; so are the probes' ports."""
    rendered = render(profile=profile)
    for service in rendered.of_kind("Service"):
        matched = [workload for workload in workloads(rendered)
                   if selects(service["spec"]["selector"],
                              workload["spec"]["template"]["metadata"]["labels"])]
        assert len(matched) == 1, service["metadata"]["name"]
        (container,) = matched[0]["spec"]["template"]["spec"]["containers"]
        names = {port["name"] for port in container["ports"]}
        assert {port["targetPort"] for port in service["spec"]["ports"]} <= names
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            port = container.get(probe, {}).get("httpGet", container.get(probe, {}).get(
                "tcpSocket", {})).get("port")
            assert port is None or port in names, (probe, port)


def test_the_bundled_redis_keeps_an_aof_on_its_volume() -> None:
    """The bundled Redis is a one-replica StatefulSet with appendonly on, its data on a
    PersistentVolumeClaim, and its password (when set) only from the Secret."""
    rendered = render(profile="bundled-monitoring")
    redis = rendered.component("StatefulSet", "redis")
    assert redis["spec"]["replicas"] == 1
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    config = rendered.component("ConfigMap", "redis")["data"]["redis.conf"].splitlines()
    assert {"appendonly yes", "appendfsync always", "dir /data",
            "maxmemory-policy noeviction"} <= set(config)
    container = rendered.container("redis")
    assert {m["mountPath"]: m["name"] for m in container["volumeMounts"]}["/data"] == "data"
    sources = {variable["name"]: variable["valueFrom"]["secretKeyRef"]
               for variable in container["env"]}
    assert sources["REDIS_PASSWORD"] == {"name": "duplex-redis", "key": "redis-password"}


@pytest.mark.parametrize("profile", ["cluster-autoscaling", "sentinel-secrets"])
def test_an_outside_redis_means_no_bundled_one(profile: str) -> None:
    """With Cluster or Sentinel the chart deploys no Redis of its own."""
    rendered = render(profile=profile)
    assert not rendered.of_kind("StatefulSet")
    assert not [obj for obj in rendered.objects
                if obj["metadata"]["labels"].get("app.kubernetes.io/component") == "redis"]


def test_network_policies_let_only_gateways_and_workers_reach_redis() -> None:
    """Redis admits only this release's gateway and worker pods; the gateways admit only the
    ingress's and the scrapers' peers; the workers only the scrapers'."""
    rendered = render({"networkPolicy": {"enabled": True}})
    policies = {policy["metadata"]["labels"]["app.kubernetes.io/component"]: policy["spec"]
                for policy in rendered.of_kind("NetworkPolicy")}
    assert set(policies) == {"gateway", "worker", "redis"}
    for component, kind in [("gateway", "Deployment"), ("worker", "Deployment"),
                            ("redis", "StatefulSet")]:
        labels = pod_labels(rendered, kind, component)
        assert selects(policies[component]["podSelector"]["matchLabels"], labels)
        assert policies[component]["policyTypes"] == ["Ingress"]
    (redis_rule,) = policies["redis"]["ingress"]
    allowed = [peer["podSelector"]["matchLabels"] for peer in redis_rule["from"]]
    for component in ("gateway", "worker"):
        assert any(selects(peer, pod_labels(rendered, "Deployment", component))
                   for peer in allowed)
    assert not any(selects(peer, pod_labels(rendered, "StatefulSet", "redis"))
                   for peer in allowed)
    namespaces = [peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                  for peer in policies["gateway"]["ingress"][0]["from"]]
    assert namespaces == ["ingress-nginx", "monitoring"]
    (worker_rule,) = policies["worker"]["ingress"]
    assert worker_rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]


def test_without_scrapers_the_workers_admit_nothing() -> None:
    """An empty metricsFrom leaves the workers no ingress rule at all (not an open one)."""
    rendered = render({"networkPolicy": {"enabled": True, "metricsFrom": []}})
    worker = rendered.component("NetworkPolicy", "worker")
    assert worker["spec"]["ingress"] == []
    assert not render().of_kind("NetworkPolicy")
