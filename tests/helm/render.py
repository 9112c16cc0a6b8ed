"""Render the Helm chart with given values and read the objects back, for the chart tests.

``render()`` runs the pinned helm (``scripts/fetch-helm`` unpacks it; it is fetched here if it
is missing) and returns the parsed objects. ``container_env()`` resolves a container's
environment the way the kubelet does: ``envFrom`` ConfigMaps and Secrets, ``env`` values and
``valueFrom`` references looked up in the rendered objects (or in Secrets the test supplies,
for ``existingSecret`` values), then ``$(VAR)`` expansion. Tests that run the rendered
containers' commands as local processes start from these: ``run_container()`` starts one
with the command, args and environment its manifest declares, and ``http_probe()`` reads a
declared probe (its named port resolved) for the test to ask as the kubelet would.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from tests.e2e.stack import KNOWN_SECRETS, Proc, log_dir, new_log_path, wait_for

__all__ = [
    "CHART",
    "HELM",
    "MONITORING_APIS",
    "POOL_LABEL",
    "PROFILES",
    "ROOT",
    "HttpProbe",
    "RenderError",
    "Rendered",
    "container_env",
    "container_ports",
    "helm",
    "helm_errors",
    "http_probe",
    "render",
    "run_container",
    "wait_for_probe",
]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "duplex-gateway"
HELM = ROOT / ".deps" / "helm" / "helm"
#: The values profiles under the chart's ci/ folder, by name ("minimal", ...).
PROFILES = {path.name.removesuffix("-values.yaml"): path
            for path in sorted((CHART / "ci").glob("*-values.yaml"))}
#: What a cluster with the Prometheus operator's CRDs serves (``--api-versions``).
MONITORING_APIS = ("monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor",
                   "monitoring.coreos.com/v1/PrometheusRule")
RELEASE = "demo"
NAMESPACE = "duplex"
#: The label naming a worker pool on its objects and pods.
POOL_LABEL = "duplex-gateway/worker-pool"


class RenderError(Exception):
    """helm refused the values or the chart; the message is helm's own."""


def helm_binary() -> Path:
    """The pinned helm, fetched with scripts/fetch-helm when it is not there yet."""
    if not HELM.is_file():
        subprocess.run([str(ROOT / "scripts" / "fetch-helm")], check=True,
                       capture_output=True, timeout=300)
    return HELM


def helm(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run helm with its own empty config, cache and data folders (nothing of the user's is
    read or written); the result is returned whatever the exit status."""
    with tempfile.TemporaryDirectory(prefix="helm-home-") as home:
        env = {**os.environ, "HELM_CONFIG_HOME": f"{home}/config",
               "HELM_CACHE_HOME": f"{home}/cache", "HELM_DATA_HOME": f"{home}/data"}
        return subprocess.run([str(helm_binary()), *args], capture_output=True, text=True,
                              env=env, timeout=timeout, check=False)


def helm_errors(stderr: str) -> str:
    """helm's stderr without its notes on the chart's links into deploy/ (walk.go)."""
    return "\n".join(line for line in stderr.splitlines()
                     if "found symbolic link in path" not in line)


@dataclass(frozen=True, slots=True)
class Rendered:
    """The objects one ``helm template`` produced, in its order."""

    objects: tuple[dict[str, Any], ...]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [obj for obj in self.objects if obj["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        """The one object of ``kind`` named ``name``; KeyError if there is none."""
        for obj in self.of_kind(kind):
            if obj["metadata"]["name"] == name:
                return obj
        raise KeyError(f"no {kind} {name!r} among {self.names()}")

    def component(self, kind: str, component: str) -> dict[str, Any]:
        """The one object of ``kind`` labelled ``app.kubernetes.io/component: component``."""
        found = [obj for obj in self.of_kind(kind)
                 if obj["metadata"].get("labels", {}).get("app.kubernetes.io/component")
                 == component]
        if len(found) != 1:
            raise KeyError(f"{len(found)} {kind} objects of component {component!r}")
        return found[0]

    def container(self, component: str) -> dict[str, Any]:
        """The container of the gateway's or worker's Deployment (or Redis's StatefulSet)."""
        kind = "StatefulSet" if component == "redis" else "Deployment"
        pod = self.component(kind, component)["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        return dict(container)

    def pool(self, kind: str, pool: str) -> dict[str, Any]:
        """The one object of ``kind`` of the worker pool named ``pool`` (by its labels)."""
        found = [obj for obj in self.of_kind(kind)
                 if obj["metadata"].get("labels", {}).get(POOL_LABEL) == pool]
        if len(found) != 1:
            raise KeyError(f"{len(found)} {kind} objects of worker pool {pool!r}")
        return found[0]

    def pool_container(self, pool: str) -> dict[str, Any]:
        """The worker container of the pool's Deployment."""
        (container,) = self.pool("Deployment", pool)["spec"]["template"]["spec"]["containers"]
        return dict(container)

    def names(self) -> list[str]:
        return [f"{obj['kind']}/{obj['metadata']['name']}" for obj in self.objects]


def render(values: Mapping[str, Any] | None = None, *, profile: str | None = None,
           api_versions: Iterable[str] = (), kube_version: str | None = None,
           release: str = RELEASE, namespace: str = NAMESPACE) -> Rendered:
    """``helm template`` the chart with a ``profile`` (a ci/ values file) and then ``values``.

    Raises:
        RenderError: helm refused (the schema, a check of the chart's, a template error).
    """
    args = ["template", release, str(CHART), "--namespace", namespace]
    if profile is not None:
        args += ["--values", str(PROFILES[profile])]
    for api in api_versions:
        args += ["--api-versions", api]
    if kube_version is not None:
        args += ["--kube-version", kube_version]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="values-") as extra:
        if values is not None:  # a file, not --set: the values keep their YAML types
            json.dump(values, extra)
            extra.flush()
            args += ["--values", extra.name]
        result = helm(*args)
    if result.returncode != 0:
        raise RenderError(helm_errors(result.stderr))
    objects = [obj for obj in yaml.safe_load_all(result.stdout) if obj]
    return Rendered(tuple(objects))


def container_env(rendered: Rendered, container: Mapping[str, Any],
                  secrets: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, str]:
    """The environment the kubelet would give ``container``.

    ConfigMaps and Secrets are looked up in ``rendered``, then in ``secrets`` (name to its
    data, in plain text: the Secrets a values file names as existing). ``envFrom`` comes first
    and ``env`` overrides it; ``$(VAR)`` names a variable defined before it (``$$`` is a
    literal ``$``; an unknown name is left as written), as Kubernetes expands them.

    Raises:
        KeyError: a ConfigMap, Secret or key that is not there.
    """
    supplied = secrets or {}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(_config_map(rendered, source["configMapRef"]["name"]))
        else:
            env.update(_secret(rendered, supplied, source["secretRef"]["name"]))
    for variable in container.get("env", []):
        if "value" in variable or "valueFrom" not in variable:
            env[variable["name"]] = _expand(variable.get("value", ""), env)
            continue
        ref = variable["valueFrom"]
        if "secretKeyRef" in ref:
            data = _secret(rendered, supplied, ref["secretKeyRef"]["name"])
            env[variable["name"]] = data[ref["secretKeyRef"]["key"]]
        else:
            data = _config_map(rendered, ref["configMapKeyRef"]["name"])
            env[variable["name"]] = data[ref["configMapKeyRef"]["key"]]
    return env


def _config_map(rendered: Rendered, name: str) -> dict[str, str]:
    return dict(rendered.get("ConfigMap", name).get("data") or {})


def _secret(rendered: Rendered, supplied: Mapping[str, Mapping[str, str]],
            name: str) -> dict[str, str]:
    try:
        secret = rendered.get("Secret", name)
    except KeyError:
        if name not in supplied:
            raise KeyError(f"Secret {name!r} is neither rendered nor supplied") from None
        return dict(supplied[name])
    decoded = {key: base64.b64decode(value).decode()
               for key, value in (secret.get("data") or {}).items()}
    return {**decoded, **(secret.get("stringData") or {})}


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def _expand(value: str, defined: Mapping[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return defined.get(match.group(1), match.group(0))

    return _REFERENCE.sub(replace, value)


# ---------------------------------------------------------------- containers as local processes

#: Variables whose values are secrets: written to the log folder's list of known secrets, so
#: the end-of-run scan fails if a process logged one.
_SECRET_VARIABLES = ("DUPLEX_GATEWAY_API_KEYS", "REDIS_PASSWORD")


def container_ports(container: Mapping[str, Any]) -> dict[str, int]:
    """The container's declared ports, by name."""
    return {port["name"]: int(port["containerPort"]) for port in container.get("ports", [])}


@dataclass(frozen=True, slots=True)
class HttpProbe:
    """A declared ``httpGet`` probe, its port resolved to a number."""

    path: str
    port: int
    timeout_s: float

    def status(self, host: str = "127.0.0.1") -> int | None:
        """The status a GET on a fresh connection answers (as the kubelet asks, with the
        probe's own timeout); None when nothing answers."""
        url = f"http://{host}:{self.port}{self.path}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            with error:
                return int(error.code)
        except (urllib.error.URLError, OSError):
            return None

    def passes(self, host: str = "127.0.0.1") -> bool:
        """Whether the kubelet would count the probe a success (a status from 200 to 399)."""
        status = self.status(host)
        return status is not None and 200 <= status < 400


def http_probe(container: Mapping[str, Any], probe: str) -> HttpProbe:
    """The container's ``probe`` (``livenessProbe``, ``readinessProbe``, ``startupProbe``);
    a named port is looked up among the container's ports, as the kubelet does.

    Raises:
        KeyError: no such probe, or a port name the container does not declare.
    """
    declared = container[probe]
    port = declared["httpGet"]["port"]
    number = container_ports(container)[port] if isinstance(port, str) else int(port)
    # The kubelet's default timeout is 1 s.
    return HttpProbe(declared["httpGet"]["path"], number,
                     float(declared.get("timeoutSeconds", 1)))


def _image_environment() -> dict[str, str]:
    """What an image gives every container besides its spec's env: a PATH, here with this
    virtualenv's bin first (where the ``duplex-gateway`` command the containers run lives),
    and a HOME. Nothing else of this process's environment: no stray DUPLEX_GATEWAY_*."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {"PATH": path, "HOME": os.environ.get("HOME", "/tmp")}


def run_container(name: str, rendered: Rendered, container: Mapping[str, Any], *,
                  secrets: Mapping[str, Mapping[str, str]] | None = None,
                  overrides: Mapping[str, str] | None = None) -> Proc:
    """Start ``container``'s ``command`` + ``args`` as a local process with the environment
    the kubelet would give it (:func:`container_env`), its output in the run's log folder.

    ``overrides`` replaces variables that must differ on one machine (a listening address);
    each must be one the container sets, so an override never hides a variable the chart
    stopped setting.

    Raises:
        AssertionError: the command is not on the PATH, or an override names a variable the
            container does not set.
    """
    env = container_env(rendered, container, secrets)
    missing = sorted(set(overrides or {}) - set(env))
    assert not missing, f"the {name} container does not set {missing}"
    env = {**_image_environment(), **env, **(overrides or {})}
    argv = [*container.get("command", []), *container.get("args", [])]
    assert argv and shutil.which(argv[0], path=env["PATH"]), f"{argv[:1]} is not on the PATH"
    _note_secrets(env)
    log = new_log_path(name)
    with log.open("wb") as sink:  # the child keeps its own descriptor
        process = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT)
    return Proc(name, process, log=log)


def _note_secrets(env: Mapping[str, str]) -> None:
    values = [value for variable in _SECRET_VARIABLES
              for value in env.get(variable, "").split(",") if value]
    with (log_dir() / KNOWN_SECRETS).open("a") as known:
        known.writelines(f"{value}\n" for value in values)


def wait_for_probe(proc: Proc, probe: HttpProbe, what: str, timeout: float = 30.0) -> None:
    """Ask ``probe`` until it passes, failing with ``what`` after ``timeout`` seconds, or at
    once, with the process's output, when the process has exited (a setting it refused)."""
    wait_for(lambda: proc.process.poll() is not None or probe.passes(), what, timeout=timeout)
    assert proc.process.poll() is None, f"{proc.name} exited:\n{proc.output()[-3000:]}"
