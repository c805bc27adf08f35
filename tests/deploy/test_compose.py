"""The compose stacks (vLLM on GPUs, llama.cpp on CPU): every service, file, port and target
they name exists and agrees with the proxy's config, and the proxy runs with that config."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from proxy.config import Config, load_config
from tests.deploy.support import (
    COMPOSE,
    CONTAINERFILE,
    DASHBOARD,
    REPO,
    hermetic,
    http_get,
    load_one,
    project_version,
    serve_config,
)

GPU = COMPOSE / "docker-compose.yaml"
CPU = COMPOSE / "docker-compose.cpu.yaml"
STACKS = [GPU, CPU]
SHARED = ("proxy", "redis", "prometheus", "grafana")
ENGINES = ("engine-0", "engine-1")


def services(path: Path) -> dict[str, Any]:
    return load_one(path)["services"]


def volume(spec: str) -> tuple[str, str]:
    """(source, target) of a short-syntax volume; the source may be ${VAR:-default}."""
    match = re.fullmatch(r"(\$\{[^}]*\}|[^:]+):([^:]+)(:ro|:rw)?", spec)
    assert match, spec
    return match[1], match[2]


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Target path -> source, for each volume of a service."""
    return {target: source for source, target in map(volume, service.get("volumes", []))}


def proxy_config() -> tuple[Config, Path, str]:
    """The proxy's config as compose mounts it: (config, host file, container path)."""
    for container, host in mounts(services(GPU)["proxy"]).items():
        config = (COMPOSE / host / "config.yaml").resolve()
        if config.is_file():
            return load_config(config).config, config, container
    raise AssertionError("no config directory is mounted into the proxy")


def engine_port(service: dict[str, Any]) -> int:
    command = service["command"]
    return int(command[command.index("--port") + 1])


def test_stacks_have_the_same_services_and_share_all_but_the_engines() -> None:
    gpu, cpu = services(GPU), services(CPU)
    assert set(gpu) == set(cpu) == {*SHARED, *ENGINES}
    for name in SHARED:
        assert gpu[name] == cpu[name], f"{name} differs between the stacks"


def test_gpu_engines_are_vllm_with_prefix_caching_one_gpu_each() -> None:
    gpu = services(GPU)
    devices = []
    for name in ENGINES:
        engine = gpu[name]
        assert "vllm/vllm-openai" in engine["image"]
        assert "--enable-prefix-caching" in engine["command"]
        (device,) = engine["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"]
        devices += device["device_ids"]
    assert len(set(devices)) == len(ENGINES)


def test_cpu_engines_are_llama_cpp_with_metrics_and_slots() -> None:
    for name in ENGINES:
        engine = services(CPU)[name]
        assert engine["image"].startswith("ghcr.io/ggml-org/llama.cpp:server")
        assert {"--metrics", "--slots"} <= set(engine["command"])


@pytest.mark.parametrize("stack", STACKS, ids=["gpu", "cpu"])
def test_proxy_backends_are_the_engines(stack: Path) -> None:
    cfg, _, _ = proxy_config()
    engines = services(stack)
    expected = {f"http://{name}:{engine_port(engines[name])}" for name in ENGINES}
    assert set(cfg.backends.static) == expected


def test_proxy_service_builds_the_image_and_listens_where_it_is_published() -> None:
    proxy = services(GPU)["proxy"]
    build = proxy["build"]
    assert (COMPOSE / build["context"] / build["dockerfile"]).resolve() == CONTAINERFILE
    assert proxy["image"] == f"prefix-proxy:{project_version()}"
    cfg, _, mount = proxy_config()
    assert mount == "/etc/prefix-proxy"
    assert cfg.listen.host == "0.0.0.0"
    published = [p.rsplit(":", 1)[1] for p in proxy["ports"]]
    assert published == [str(cfg.listen.port)]
    assert all(
        p.startswith("127.0.0.1:") for s in services(GPU).values() for p in s.get("ports", [])
    )
    for name, value in proxy["environment"].items():
        assert name in {cfg.admin.token_env, cfg.auth.api_keys_env}, name
        assert value == f"${{{name}:-}}"


def test_redis_url_names_the_redis_service() -> None:
    cfg, _, _ = proxy_config()
    url = urlparse(cfg.cluster.redis_url)
    assert url.hostname in services(GPU)
    assert url.port == 6379 and "redis-server" in services(GPU)[url.hostname]["command"]


@pytest.mark.parametrize("stack", STACKS, ids=["gpu", "cpu"])
def test_mounted_files_exist(stack: Path) -> None:
    checked = 0
    for name, service in services(stack).items():
        for host in mounts(service).values():
            if host.startswith("${"):  # the user's model directory, with a default
                assert name in ENGINES and host.endswith(":-./models}")
            elif host.startswith((".", "/")):
                assert (COMPOSE / host).exists(), f"{name}: {host} does not exist"
                checked += 1
    assert checked >= 5


def test_prometheus_scrapes_the_proxy_and_the_engines_and_loads_the_alerts() -> None:
    cfg, _, _ = proxy_config()
    prometheus = services(GPU)["prometheus"]
    mounted = {target: COMPOSE / source for target, source in mounts(prometheus).items()}
    config_path = next(a.split("=", 1)[1] for a in prometheus["command"] if "config.file" in a)
    scrape = load_one(mounted[config_path])
    for rule_file in scrape["rule_files"]:
        assert mounted[rule_file].is_file()
    targets = {
        job["job_name"]: {t for s in job["static_configs"] for t in s["targets"]}
        for job in scrape["scrape_configs"]
    }
    assert targets["prefix-proxy"] == {f"proxy:{cfg.listen.port}"}
    assert targets["engines"] == {urlparse(b).netloc for b in cfg.backends.static}
    assert all("metrics_path" not in job for job in scrape["scrape_configs"])  # /metrics


def test_grafana_provisions_prometheus_and_the_dashboard() -> None:
    grafana = services(GPU)["grafana"]
    mounted = mounts(grafana)
    provisioning = COMPOSE / mounted["/etc/grafana/provisioning"]
    (source,) = load_one(provisioning / "datasources" / "prometheus.yaml")["datasources"]
    url = urlparse(source["url"])
    assert url.hostname == "prometheus" and source["isDefault"] is True
    assert "prometheus" in services(GPU) and url.port == 9090
    (provider,) = load_one(provisioning / "dashboards" / "prefix-proxy.yaml")["providers"]
    folder = provider["options"]["path"]
    dashboards = {c: h for c, h in mounted.items() if c.startswith(folder + "/")}
    assert [(COMPOSE / h).resolve() for h in dashboards.values()] == [DASHBOARD]


def test_dashboard_works_when_provisioned() -> None:
    """Provisioned dashboards cannot answer the import dialog's ${DS_...} inputs: the
    dashboard must pick its data source through a variable."""
    if not DASHBOARD.exists():
        pytest.skip(f"{DASHBOARD.relative_to(REPO)} is not written yet")
    text = DASHBOARD.read_text()
    dashboard = json.loads(text)
    assert "__inputs" not in dashboard and not re.search(r"\$\{DS_", text)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert any(v["type"] == "datasource" and v["query"] == "prometheus" for v in variables.values())


def test_proxy_runs_with_the_compose_config(tmp_path: Path) -> None:
    _, config, _ = proxy_config()
    copy = tmp_path / "config.yaml"
    copy.write_text(config.read_text())
    hermetic(copy)
    with serve_config(copy) as proxy:
        assert http_get(proxy.url + "/health") == 200
        assert http_get(proxy.url + "/ready") == 503  # no engine here
