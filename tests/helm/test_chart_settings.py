"""Every setting the processes read can be set through the chart's values, with the code's
defaults, and reaches the containers the way the processes read it.

The containers' environment is resolved from the rendered objects (tests/helm/render.py) and
read by the processes' own ``from_env``, so a setting the chart misspells, formats wrongly or
forgets fails here.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
import yaml  # type: ignore[import-untyped]

from contract.models import MODEL_NAME_PATTERN
from duplex_gateway.logs import LogSettings
from gateway.settings import GatewaySettings
from inference_worker.settings import WorkerSettings
from runtime.config import NON_NEGATIVE, Choices, ModelName, Range, Rule, from_env
from store.client import parse_sentinel_url
from tests.helm.render import CHART, Rendered, container_env, render

VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())

#: The settings the chart sets from values of its own (not the settings maps), and where.
GATEWAY_MANAGED = {"host": "always 0.0.0.0", "port": "gateway.port",
                   "redis_url": "redis.*", "api_keys": "apiKeys.*"}
WORKER_MANAGED = {"redis_url": "redis.*", "backend": "worker.backend",
                  "slots": "worker.slots", "device": "worker.device", "dtype": "worker.dtype",
                  "backend_options": "worker.backendOptions",
                  "drain_timeout_s": "worker.drainTimeoutSeconds",
                  "model_path": "worker.model.path", "metrics_port": "worker.metricsPort",
                  "metrics_host": "always 0.0.0.0",
                  "served_model_names": "workerPools[].models"}
#: Where the chart departs from the code's default on purpose: a pod's listeners must be
#: reachable on its address (probes, Services, scrapes), the worker's metrics on for its
#: probes, and Redis is the release's own.
BUNDLED_REDIS = "redis://demo-duplex-gateway-redis:6379/0"
GATEWAY_CHART_DEFAULTS: dict[str, Any] = {"host": "0.0.0.0", "redis_url": BUNDLED_REDIS}
WORKER_CHART_DEFAULTS: dict[str, Any] = {"metrics_host": "0.0.0.0", "metrics_port": 9100,
                                         "redis_url": BUNDLED_REDIS}
SETTINGS_MAPS: list[tuple[type[Any], tuple[str, ...], dict[str, str]]] = [
    (GatewaySettings, ("gateway", "settings"), GATEWAY_MANAGED),
    (WorkerSettings, ("worker", "settings"), WORKER_MANAGED),
    (LogSettings, ("logs",), {}),
]


def at(tree: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def schema_at(path: tuple[str, ...]) -> dict[str, Any]:
    node: dict[str, Any] = SCHEMA
    for key in path:
        node = node["properties"][key]
    return node


@pytest.mark.parametrize(("cls", "path", "managed"), SETTINGS_MAPS)
def test_every_setting_is_covered_once(cls: type[Any], path: tuple[str, ...],
                                       managed: dict[str, str]) -> None:
    """Each field is in the settings map or set by the chart from its own value, not both."""
    fields = {f.name for f in dataclasses.fields(cls)}
    in_map = set(at(VALUES, path))
    assert not in_map & set(managed)
    assert in_map | set(managed) == fields


@pytest.mark.parametrize(("cls", "path", "managed"), SETTINGS_MAPS)
def test_the_settings_maps_hold_the_codes_defaults(cls: type[Any], path: tuple[str, ...],
                                                   managed: dict[str, str]) -> None:
    """values.yaml's default of each setting equals the code's, with the type the process
    parses it as (an integer default stays an integer)."""
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    for name, value in at(VALUES, path).items():
        assert (type(value), value) == (type(defaults[name]), defaults[name]), name


def expected_schema(f: dataclasses.Field[Any]) -> dict[str, Any]:
    """What the schema must say of a setting: the type ``from_env`` parses (the default's)
    and the field's range, choices or model-name pattern. A number without a rule of its own
    accepts 0 and up."""
    default = f.default
    kind = {bool: "boolean", int: "integer", float: "number", str: "string"}[type(default)]
    rule: Rule | None = f.metadata.get("accepts")
    if rule is None and kind in ("integer", "number"):
        rule = NON_NEGATIVE
    expected: dict[str, Any] = {"type": kind}
    if isinstance(rule, Range):
        expected["exclusiveMinimum" if rule.low_open else "minimum"] = rule.low
        if rule.high is not None:
            expected["maximum"] = rule.high
    elif isinstance(rule, Choices):
        expected["enum"] = list(rule.values)
    elif isinstance(rule, ModelName):
        expected["pattern"] = f"^$|{MODEL_NAME_PATTERN}"
    return expected


@pytest.mark.parametrize(("cls", "path", "managed"), SETTINGS_MAPS)
def test_the_schema_states_each_settings_type_and_range(cls: type[Any], path: tuple[str, ...],
                                                        managed: dict[str, str]) -> None:
    """The schema refuses what the process would refuse: same type, same bounds, same
    choices, and no key the process does not read."""
    node = schema_at(path)
    assert node["additionalProperties"] is False
    in_map = [f for f in dataclasses.fields(cls) if f.name not in managed]
    assert set(node["properties"]) == {f.name for f in in_map}
    for f in in_map:
        stated = {key: value for key, value in node["properties"][f.name].items()
                  if key != "description"}
        assert stated == expected_schema(f), f.name


def gateway_and_worker(rendered: Rendered, secrets: dict[str, dict[str, str]] | None = None,
                       ) -> tuple[GatewaySettings, WorkerSettings, LogSettings, LogSettings]:
    """The settings the rendered containers' processes would build from their environment."""
    gateway_env = container_env(rendered, rendered.container("gateway"), secrets)
    worker_env = container_env(rendered, rendered.container("worker"), secrets)
    return (from_env(GatewaySettings, gateway_env), from_env(WorkerSettings, worker_env),
            from_env(LogSettings, gateway_env), from_env(LogSettings, worker_env))


def test_the_default_chart_gives_the_processes_the_codes_defaults() -> None:
    """Rendered with no values, each process reads the code's default for every setting but
    the few the chart sets on purpose (listen on the pod's address, metrics on, its Redis)."""
    gateway, worker, gateway_logs, worker_logs = gateway_and_worker(render())
    assert gateway == GatewaySettings(**GATEWAY_CHART_DEFAULTS)
    assert worker == WorkerSettings(**WORKER_CHART_DEFAULTS)
    assert gateway_logs == worker_logs == LogSettings()


def test_values_reach_the_processes_as_they_parse_them() -> None:
    """Every kind of value survives the chart: an integer too large for helm's float printing,
    a fraction, a choice, the worker's own keys and the log format."""
    values = {
        "gateway": {"port": 8443, "settings": {"max_frame_bytes": 33554433,
                                               "input_log_max_bytes": 0,
                                               "reaper_interval_s": 0.125,
                                               "idle_ttl_s": 1e-3}},
        "worker": {"backend": "fake", "slots": 3, "device": "cuda:1", "dtype": "bfloat16",
                   "backendOptions": "mode=tone,step_ms=5", "drainTimeoutSeconds": 7,
                   "terminationGracePeriodSeconds": 20, "metricsPort": 9200,
                   "model": {"path": "/models/m", "volume": {"type": "persistentVolumeClaim",
                                                              "claimName": "weights"}},
                   "settings": {"vad": "energy", "heartbeat_ttl_s": 2.5}},
        "logs": {"log_level": "debug", "log_format": "json"},
    }
    gateway, worker, gateway_logs, worker_logs = gateway_and_worker(render(values))
    assert (gateway.port, gateway.max_frame_bytes, gateway.input_log_max_bytes,
            gateway.reaper_interval_s, gateway.idle_ttl_s) == (8443, 33554433, 0, 0.125, 1e-3)
    assert (worker.backend, worker.slots, worker.device, worker.dtype, worker.backend_options,
            worker.drain_timeout_s, worker.metrics_port, worker.model_path, worker.vad,
            worker.heartbeat_ttl_s) == ("fake", 3, "cuda:1", "bfloat16", "mode=tone,step_ms=5",
                                        7.0, 9200, "/models/m", "energy", 2.5)
    assert gateway_logs == worker_logs == LogSettings(log_level="debug", log_format="json")


def plain_text(rendered: Rendered) -> str:
    """Everything a reader of the pod specs and ConfigMaps sees (Secrets left out)."""
    return json.dumps([obj for obj in rendered.objects if obj["kind"] != "Secret"])


@pytest.mark.parametrize(("mode", "redis_values"), [
    ("bundled", {}),
    ("external", {"external": {"url": "rediss://redis.example:6380/3"}}),
    ("sentinel", {"sentinel": {"hosts": ["s1:26379", "s2:26379"], "service": "main", "db": 1}}),
    ("cluster", {"cluster": {"host": "seed", "port": 7000}}),
])
def test_the_redis_password_reaches_the_url_from_its_secret_only(
        mode: str, redis_values: dict[str, Any]) -> None:
    """In every Redis mode the URL the processes read carries the password of the Secret,
    which appears in no pod spec or ConfigMap: the URL holds $(REDIS_PASSWORD), defined from
    the Secret just before it, as the kubelet expands it."""
    password = "Pa55-word.~_x"
    rendered = render({"redis": {"mode": mode, "auth": {"existingSecret": "redis-auth"},
                                 **redis_values}})
    assert password not in plain_text(rendered)
    for component in ("gateway", "worker"):
        env = rendered.container(component)["env"]
        names = [variable["name"] for variable in env]
        assert names.index("REDIS_PASSWORD") < names.index("DUPLEX_GATEWAY_REDIS_URL")
        (secret_ref,) = [variable["valueFrom"]["secretKeyRef"] for variable in env
                         if variable["name"] == "REDIS_PASSWORD"]
        assert secret_ref == {"name": "redis-auth", "key": "redis-password"}
    gateway, worker, *_ = gateway_and_worker(rendered, {"redis-auth": {"redis-password": password}})
    assert gateway.redis_url == worker.redis_url
    assert url_password(gateway.redis_url) == password


def url_password(url: str) -> str | None:
    """The password the store's client takes from ``url``: the store's own parsing for
    Sentinel; for the others redis-py's, which unquotes the URL's userinfo password."""
    if url.startswith("redis+sentinel://"):
        return parse_sentinel_url(url).password
    password = urlsplit(url).password
    return None if password is None else unquote(password)


def test_without_a_password_secret_the_url_has_no_credentials() -> None:
    """No redis.auth.existingSecret: no REDIS_PASSWORD variable and a URL without userinfo."""
    rendered = render({"redis": {"mode": "cluster", "cluster": {"host": "seed"}}})
    gateway, *_ = gateway_and_worker(rendered)
    assert gateway.redis_url == "redis+cluster://seed:6379"
    assert "REDIS_PASSWORD" not in container_env(rendered, rendered.container("gateway"))


@pytest.mark.parametrize("api_keys", [
    {"create": True, "keys": ["sk-one", "sk-two"]},
    {"existingSecret": "keys", "existingSecretKey": "list"},
])
def test_api_keys_come_from_a_secret_only(api_keys: dict[str, Any]) -> None:
    """The gateway reads its API keys from a Secret (created by the chart or existing),
    through secretKeyRef; no ConfigMap or plain env value carries them."""
    rendered = render({"apiKeys": api_keys})
    existing = {"keys": {"list": "sk-one,sk-two"}}
    gateway, *_ = gateway_and_worker(rendered, existing)
    assert gateway.api_keys == ("sk-one", "sk-two")
    assert "sk-one" not in plain_text(rendered)
    (variable,) = [variable for variable in rendered.container("gateway")["env"]
                   if variable["name"] == "DUPLEX_GATEWAY_API_KEYS"]
    assert set(variable) == {"name", "valueFrom"}
    worker_env = container_env(rendered, rendered.container("worker"), existing)
    assert "DUPLEX_GATEWAY_API_KEYS" not in worker_env


def test_no_api_keys_means_no_variable() -> None:
    """Without keys the gateway gets no DUPLEX_GATEWAY_API_KEYS (the code's no-auth default)."""
    rendered = render()
    names = [variable["name"] for variable in rendered.container("gateway")["env"]]
    assert "DUPLEX_GATEWAY_API_KEYS" not in names
    assert not rendered.of_kind("Secret")


def test_a_rendered_settings_error_would_stop_the_process() -> None:
    """The check can fail: a value the process refuses (the schema checks ranges, not every
    relation) is caught by reading the rendered environment with the process's parser."""
    rendered = render({"worker": {"settings": {"heartbeat_interval_s": 2.0}}})
    env = container_env(rendered, rendered.container("worker"))
    with pytest.raises(ValueError, match="DUPLEX_GATEWAY_HEARTBEAT_TTL_S"):
        from_env(WorkerSettings, env)

