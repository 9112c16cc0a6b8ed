"""Worker pools: each entry of ``workerPools`` is its own Deployment, ConfigMap, Service and
HPA, runs ``worker``'s values with the pool's own over them, and serves its model names.

What a pool's workers run is read as they would read it: the container's environment resolved
from the rendered objects and parsed by the worker's own ``from_env``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml  # type: ignore[import-untyped]

from contract.models import MAX_MODEL_NAMES, MODEL_NAME_PATTERN
from gateway.settings import GatewaySettings
from inference_worker.settings import WorkerSettings
from runtime.config import from_env
from tests.helm.render import CHART, POOL_LABEL, PROFILES, Rendered, container_env, render

pytestmark = pytest.mark.timeout(120)

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
#: Kubernetes' DNS-1035 label: what a Service's name must be (and every name here is one).
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
#: The oldest and newest Kubernetes the chart supports (as test_chart_schemas.py).
KUBE_VERSIONS = ("1.29", "1.37")

#: Two pools over shared defaults: a GPU pool that overrides some keys and merges others,
#: and a CPU pool that drops the shared node selector and turns the GPUs back off.
TWO_POOLS: dict[str, Any] = {
    "worker": {
        "gpu": {"count": 1, "resourceName": "example.com/gpu"},
        "nodeSelector": {"gpu": "any"},
        "resources": {"requests": {"cpu": "2", "memory": "8Gi"}},
        "settings": {"vad": "energy", "tick_window": 300},
    },
    "workerPools": [
        {"name": "moshi", "models": ["moshiko", "kyutai/moshiko-pytorch-bf16"],
         "backend": "moshi", "device": "cuda", "dtype": "bfloat16", "slots": 8,
         "backendOptions": "temp=0.8",
         "autoscaling": {"enabled": True, "maxReplicas": 6},
         "tolerations": [{"key": "example.com/gpu", "operator": "Exists",
                          "effect": "NoSchedule"}],
         "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
             "nodeSelectorTerms": [{"matchExpressions": [
                 {"key": "gpu.product", "operator": "In", "values": ["H100"]}]}]}}},
         "model": {"path": "/models/moshiko",
                   "volume": {"type": "persistentVolumeClaim", "claimName": "moshiko"}},
         "settings": {"tick_window": 100}},
        {"name": "echo", "models": ["loopback"], "replicas": 3, "gpu": {"count": 0},
         "nodeSelector": {}, "resources": {"limits": {"memory": "1Gi"}}},
    ],
    "gateway": {"settings": {"default_model": "moshiko"}},
}


def pod_spec(rendered: Rendered, pool: str) -> dict[str, Any]:
    return dict(rendered.pool("Deployment", pool)["spec"]["template"]["spec"])


def pool_settings(rendered: Rendered, pool: str,
                  secrets: dict[str, dict[str, str]] | None = None) -> WorkerSettings:
    """What the pool's worker process would read from its environment."""
    env = container_env(rendered, rendered.pool_container(pool), secrets)
    return from_env(WorkerSettings, env)


def test_the_default_is_one_pool_running_worker_as_it_is() -> None:
    """No workerPools value: one pool, `default`, serving the backend's own name, and each
    ci/ profile's worker values reach that pool unchanged."""
    rendered = render()
    assert rendered.component("Deployment", "worker")["metadata"]["name"] == (
        "demo-duplex-gateway-worker-default")
    assert pool_settings(rendered, "default").served_model_names == ()
    gpu = render(profile="bundled-monitoring")
    password = {"duplex-redis": {"redis-password": "unused"}}
    assert pool_settings(gpu, "default", password).backend == "moshi"
    assert gpu.pool_container("default")["resources"]["limits"]["nvidia.com/gpu"] == 1
    for profile in PROFILES:
        assert [obj["metadata"]["labels"][POOL_LABEL]
                for obj in render(profile=profile).of_kind("Deployment")
                if obj["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
                ] == ["default"]


def test_each_pool_has_its_own_objects_selecting_only_its_pods() -> None:
    """Per pool a Deployment, ConfigMap, Service and PodDisruptionBudget named after it; the
    Deployment's, Service's and budget's selectors match its own pods only; its env reads its
    own ConfigMap."""
    rendered = render(TWO_POOLS)
    labels = {pool: rendered.pool("Deployment", pool)["spec"]["template"]["metadata"]["labels"]
              for pool in ("moshi", "echo")}
    for pool, other in [("moshi", "echo"), ("echo", "moshi")]:
        name = f"demo-duplex-gateway-worker-{pool}"
        for kind in ("Deployment", "ConfigMap", "Service", "PodDisruptionBudget"):
            assert rendered.pool(kind, pool)["metadata"]["name"] == name
        for selector in (rendered.pool("Deployment", pool)["spec"]["selector"]["matchLabels"],
                         rendered.pool("Service", pool)["spec"]["selector"],
                         rendered.pool("PodDisruptionBudget", pool)["spec"]["selector"][
                             "matchLabels"]):
            assert selector.items() <= labels[pool].items()
            assert not selector.items() <= labels[other].items()
        (source,) = rendered.pool_container(pool)["envFrom"]
        assert source == {"configMapRef": {"name": name}}


def test_each_pools_workers_read_their_own_values() -> None:
    """The worker processes of each pool read the pool's backend and model names, the
    shared settings with the pool's own over them, and the gateway its default model."""
    rendered = render(TWO_POOLS)
    moshi = pool_settings(rendered, "moshi")
    assert (moshi.served_model_names, moshi.backend, moshi.device, moshi.dtype, moshi.slots,
            moshi.backend_options, moshi.model_path, moshi.vad, moshi.tick_window) == (
        ("moshiko", "kyutai/moshiko-pytorch-bf16"), "moshi", "cuda", "bfloat16", 8,
        "temp=0.8", "/models/moshiko", "energy", 100)
    echo = pool_settings(rendered, "echo")
    assert (echo.served_model_names, echo.backend, echo.slots, echo.vad,
            echo.tick_window) == (("loopback",), "loopback", 16, "energy", 300)
    gateway = rendered.component("Deployment", "gateway")
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    assert from_env(GatewaySettings, container_env(rendered, container)).default_model == "moshiko"


def test_each_pool_gets_its_gpus_placement_and_volume() -> None:
    """GPU requests, node selector, tolerations, affinity, resources and the model volume
    follow the pool: a pool's map of the chart's own merges (gpu.count keeps resourceName),
    a Kubernetes structure it gives replaces the shared one whole, a zero value counts."""
    rendered = render(TWO_POOLS)
    moshi = pod_spec(rendered, "moshi")
    (container,) = moshi["containers"]
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "8Gi",
                                                    "example.com/gpu": 1},
                                      "limits": {"example.com/gpu": 1}}
    assert moshi["nodeSelector"] == {"gpu": "any"}
    assert moshi["tolerations"][0]["key"] == "example.com/gpu"
    assert "nodeAffinity" in moshi["affinity"]
    (volume,) = [v for v in moshi["volumes"] if v["name"] == "model"]
    assert volume["persistentVolumeClaim"] == {"claimName": "moshiko", "readOnly": True}
    echo = pod_spec(rendered, "echo")
    (container,) = echo["containers"]
    assert container["resources"] == {"limits": {"memory": "1Gi"}}
    assert not {"nodeSelector", "tolerations", "affinity"} & set(echo)
    assert [v["name"] for v in echo["volumes"]] == ["tmp"]


def test_an_autoscaled_pool_has_its_own_hpa() -> None:
    """Autoscaling on in one pool: an autoscaling/v2 HPA on that pool's Deployment, with the
    shared bounds and slow scale-down but the pool's maximum, and that Deployment leaves its
    replica count to it; the other pool keeps its replicas and has none."""
    rendered = render(TWO_POOLS)
    (hpa,) = rendered.of_kind("HorizontalPodAutoscaler")
    assert hpa["metadata"]["labels"][POOL_LABEL] == "moshi"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "demo-duplex-gateway-worker-moshi"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 6)
    assert hpa["spec"]["behavior"]["scaleDown"]["policies"] == [
        {"type": "Pods", "value": 1, "periodSeconds": 300}]
    assert "replicas" not in rendered.pool("Deployment", "moshi")["spec"]
    assert rendered.pool("Deployment", "echo")["spec"]["replicas"] == 3


def test_each_pools_disruption_budget_is_its_own() -> None:
    """A node drain takes one worker of a pool at a time by default; a pool may allow more, or
    have no budget, without changing the others'."""
    assert [pdb["spec"]["maxUnavailable"]
            for pdb in render(TWO_POOLS).of_kind("PodDisruptionBudget")
            if pdb["metadata"]["labels"].get(POOL_LABEL)] == [1, 1]
    pools = [{**TWO_POOLS["workerPools"][0], "podDisruptionBudget": {"maxUnavailable": 2}},
             {**TWO_POOLS["workerPools"][1], "podDisruptionBudget": {"enabled": False}}]
    rendered = render({**TWO_POOLS, "workerPools": pools})
    assert rendered.pool("PodDisruptionBudget", "moshi")["spec"]["maxUnavailable"] == 2
    assert [pdb["metadata"]["labels"].get(POOL_LABEL)
            for pdb in rendered.of_kind("PodDisruptionBudget")] == [None, "moshi"]


def test_a_settings_change_rolls_only_its_pools_pods() -> None:
    """Each pool's pods carry the checksum of their own ConfigMap."""
    def checksums(values: dict[str, Any]) -> dict[str, str]:
        rendered = render(values)
        return {pool: rendered.pool("Deployment", pool)["spec"]["template"]["metadata"][
            "annotations"]["checksum/settings"] for pool in ("moshi", "echo")}

    changed = json.loads(json.dumps(TWO_POOLS))
    changed["workerPools"][1]["settings"] = {"vad": "auto"}
    before, after = checksums(TWO_POOLS), checksums(changed)
    assert before["moshi"] == after["moshi"]
    assert before["echo"] != after["echo"]


def test_monitoring_and_network_policies_cover_every_pool() -> None:
    """The one worker ServiceMonitor selects every pool's Service; the workers' policy selects
    every pool's pods, and the bundled Redis admits them."""
    rendered = render({**TWO_POOLS, "networkPolicy": {"enabled": True},
                       "monitoring": {"serviceMonitor": {"enabled": True}}})
    monitor = rendered.component("ServiceMonitor", "worker")["spec"]["selector"]["matchLabels"]
    policies = {policy["metadata"]["labels"]["app.kubernetes.io/component"]: policy["spec"]
                for policy in rendered.of_kind("NetworkPolicy")}
    (redis_rule,) = policies["redis"]["ingress"]
    peers = [peer["podSelector"]["matchLabels"] for peer in redis_rule["from"]]
    for pool in ("moshi", "echo"):
        pods = rendered.pool("Deployment", pool)["spec"]["template"]["metadata"]["labels"]
        assert monitor.items() <= rendered.pool("Service", pool)["metadata"]["labels"].items()
        assert policies["worker"]["podSelector"]["matchLabels"].items() <= pods.items()
        assert any(peer.items() <= pods.items() for peer in peers)


def test_long_names_stay_valid_and_distinct() -> None:
    """The longest release prefix and pool names: every object name is a DNS label of at most
    63 characters, the pools' names end with the whole pool name, and none is given twice."""
    pools = ["a" * 20, "a" * 19 + "b", "p"]
    rendered = render({"fullnameOverride": "x" * 63,
                       "workerPools": [{"name": name} for name in pools]})
    for kind in ("Deployment", "Service", "ConfigMap"):
        names = [obj["metadata"]["name"] for obj in rendered.of_kind(kind)]
        assert len(names) == len(set(names)), kind
        for name in names:
            assert DNS_LABEL.match(name), name
    for pool in pools:
        assert rendered.pool("Service", pool)["metadata"]["name"].endswith(f"-worker-{pool}")


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_pools_validate_strictly(version: str) -> None:
    """Every object of the two-pool release validates against Kubernetes' strict schemas."""
    for obj in render(TWO_POOLS).objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {error.message}")


def test_a_pool_takes_exactly_workers_keys_with_their_schema() -> None:
    """A pool's keys are name, models and each of worker's, each checked by worker's own
    schema; model names as the store accepts them, as many as a worker may serve."""
    worker = SCHEMA["properties"]["worker"]["properties"]
    pool = SCHEMA["properties"]["workerPools"]["items"]
    assert pool["additionalProperties"] is False and pool["required"] == ["name"]
    assert set(pool["properties"]) == {"name", "models", *worker}
    for key in worker:
        assert pool["properties"][key] == {"$ref": f"#/properties/worker/properties/{key}"}
    models = pool["properties"]["models"]
    assert models["items"]["pattern"] == MODEL_NAME_PATTERN
    assert (models["maxItems"], models["uniqueItems"]) == (MAX_MODEL_NAMES, True)


def test_the_readmes_example_renders_as_it_says() -> None:
    """The chart README's worker-pool example renders two pools with their models."""
    text = (CHART / "README.md").read_text()
    section = text.split("## Worker pools", 1)[1]
    example = yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    rendered = render(example)
    assert pool_settings(rendered, "moshi").served_model_names == (
        "moshiko", "kyutai/moshiko-pytorch-bf16")
    assert pool_settings(rendered, "cascade").backend == "cascade"
    assert rendered.pool("HorizontalPodAutoscaler", "cascade")
