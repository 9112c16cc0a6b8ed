"""The shipped dashboard and alert rules, run on a real Prometheus scraping a real stack.

Every panel query and every alert expression must parse and evaluate, and every metric they
name must be one that a gateway or a worker exports: a renamed metric breaks this test, not a
dashboard in production.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from duplex_client import DuplexClient
from runtime.embedded import free_port
from tests.e2e.helpers import collect_until
from tests.e2e.stack import Stack, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "duplex-gateway.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
METRIC = re.compile(r"\bduplex_[a-z_]+\b")


def binary(name: str) -> str:
    """``prometheus`` or ``promtool``: on PATH, or unpacked by scripts/fetch-prometheus.
    Missing is a failure, not a skip."""
    found = shutil.which(name) or ROOT / ".deps" / "prometheus" / "usr" / "bin" / name
    assert Path(found).is_file(), f"{name} is missing: run scripts/fetch-prometheus"
    return str(found)


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, Grafana variables filled in."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(panel["title"], target["expr"].replace("$__rate_interval", "1m"))
            for panel in panels for target in panel.get("targets", [])]


def api(base: str, path: str, **params: str) -> Any:
    """A Prometheus HTTP API answer's data (asserting status success)."""
    url = f"{base}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=5) as response:
        answer = json.loads(response.read())
    assert answer["status"] == "success", answer
    return answer["data"]


def test_alert_rules_pass_promtool() -> None:
    """promtool accepts the rule file."""
    done = subprocess.run([binary("promtool"), "check", "rules", str(ALERTS)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_is_well_formed() -> None:
    """Unique panel ids, every target on the datasource variable, every graph with a query."""
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["templating"]["list"][0]["query"] == "prometheus"
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


@pytest.fixture
def prometheus(stack: Stack, tmp_path: Path) -> Iterator[str]:
    """A gateway and a fake-backend worker with traffic, scraped by a real Prometheus that
    loads the shipped rules; yields its base URL once both targets are up."""
    gateway = stack.gateway()
    worker = stack.worker(backend="fake", metrics_port=free_port())
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {"job_name": "duplex-gateway",
             "static_configs": [{"targets": [f"127.0.0.1:{gateway.port}"]}]},
            {"job_name": "duplex-worker",
             "static_configs": [{"targets": [f"127.0.0.1:{worker.port}"]}]},
        ],
    }))
    process = subprocess.Popen(
        [binary("prometheus"), f"--config.file={config}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        def targets_up() -> bool:
            try:
                active = api(base, "targets")["activeTargets"]
            except OSError:
                return process.poll() is not None
            return len(active) == 2 and all(t["health"] == "up" for t in active)

        wait_for(targets_up, "both targets up", timeout=30)
        assert process.poll() is None, "prometheus exited"
        yield base
    finally:
        process.terminate()
        process.wait(timeout=10)


async def test_every_query_runs_on_real_metrics(stack: Stack, prometheus: str) -> None:
    """Each panel and alert query evaluates; each metric it names is exported; the rules
    were evaluated without error; the relay and tick panels have data."""
    gateway = next(p for p in stack.procs if p.name == "gateway")
    async with await DuplexClient.connect(gateway.ws_url) as client:
        await collect_until(client, "session.updated", [])
        for _ in range(3):
            await client.heartbeat()
            await collect_until(client, "session.heartbeat_ack", [])
        await client.resume()
        await client.heartbeat()
        await collect_until(client, "session.heartbeat_ack", [])

    def scraped(query: str) -> bool:
        return bool(api(prometheus, "query", query=query)["result"])

    # A scrape after the traffic (the fixture saw one before it): rate() has two points.
    wait_for(lambda: scraped("increase(duplex_gateway_relay_seconds_count[1m]) > 0")
             and scraped("increase(duplex_gateway_resume_seconds_count[1m]) > 0")
             and scraped("increase(duplex_worker_tick_seconds_count[1m]) > 0"),
             "relay, resume and tick samples", timeout=30)

    names = {series["__name__"] for series in api(
        prometheus, "series", **{"match[]": '{__name__=~"duplex_.+"}'})}
    rules = [rule for group in api(prometheus, "rules")["groups"] for rule in group["rules"]]
    queries = dashboard_queries() + [(rule["name"], rule["query"]) for rule in rules]
    assert len(rules) == ALERTS.read_text().count("- alert:") == 15  # every rule loaded
    for title, query in queries:
        api(prometheus, "query", query=query)  # parses and evaluates
        for name in METRIC.findall(query):
            assert name in names, f"{title}: {name} is not exported"
    by_title = dict(dashboard_queries())
    for title in ("Relay time in the gateway, p50 and p99", "Tick time, p99"):
        assert api(prometheus, "query", query=by_title[title])["result"], title

    def evaluated() -> bool:
        current = [r for g in api(prometheus, "rules")["groups"] for r in g["rules"]]
        return all(r["lastEvaluation"] > "2000" for r in current)

    wait_for(evaluated, "every rule evaluated", timeout=15)
    for group in api(prometheus, "rules")["groups"]:
        for rule in group["rules"]:
            assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
