"""The Kubernetes manifests: they parse, validate against the official schemas, render with
kustomize, and every port, path, name, config key and metric name in them matches the code.
The proxy runs for real with each ConfigMap's config, and the probes are tried against it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import ParseResult, urlparse

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from proxy.config import LoadedConfig, load_config
from tests.deploy.crd_schemas import CRD_SCHEMAS, PROMETHEUS_RULE
from tests.deploy.support import (
    BASE,
    CONFIG_MAP,
    DASHBOARD,
    DEPLOY,
    EXAMPLES,
    KUBE,
    KUSTOMIZATIONS,
    OVERLAYS,
    Build,
    RunningProxy,
    config_map_config,
    containers,
    hermetic,
    http_get,
    http_text,
    instruction,
    iter_yaml_files,
    kubectl,
    labels_match,
    load_docs,
    load_one,
    mounts_config_map,
    obj_key,
    pod_spec,
    project_version,
    rel,
    render,
    resolve,
    serve_config,
    urls_in,
)

IDS = [p.name for p in KUSTOMIZATIONS]
# The oldest Kubernetes the manifests support (native sidecars are on by default from 1.29)
# and the newest the bundled schemas know.
OLDEST_K8S = "1.29.0"
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
needs_kubectl = pytest.mark.skipif(kubectl() is None, reason="kubectl (kustomize) not installed")


@pytest.fixture(scope="module")
def builds() -> dict[str, Build]:
    return {root.name: resolve(root) for root in KUSTOMIZATIONS}


@pytest.fixture(scope="module")
def configs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LoadedConfig]:
    """Each kustomization's ConfigMap written out as the kubelet mounts it, then loaded."""
    out = {}
    for root in KUSTOMIZATIONS:
        path = config_map_config(root, tmp_path_factory.mktemp(root.name))
        out[root.name] = load_config(path)
    return out


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], RunningProxy]]:
    """The proxy serving a kustomization's ConfigMap config (on loopback, without discovery
    and Redis), started on first use and kept for the module."""
    roots = {root.name: root for root in KUSTOMIZATIONS}
    started: dict[str, RunningProxy] = {}
    with ExitStack() as stack:

        def start(name: str) -> RunningProxy:
            if name not in started:
                path = config_map_config(roots[name], tmp_path_factory.mktemp(f"live-{name}"))
                hermetic(path)
                started[name] = stack.enter_context(serve_config(path))
            return started[name]

        yield start


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    if kubectl() is None:
        pytest.skip("kubectl (kustomize) not installed")
    return {root.name: render(root) for root in KUSTOMIZATIONS}


def proxy_containers(build: Build) -> Iterator[tuple[dict, dict, dict, str]]:
    """(object, pod spec, container, config mount path) for each container running the proxy:
    the ones that mount its ConfigMap."""
    for obj in build.objects.values():
        pod = pod_spec(obj)
        for c in containers(pod) if pod else []:
            mount = mounts_config_map(pod, c, CONFIG_MAP)
            if mount is not None:
                yield obj, pod, c, mount


# Files


def test_every_yaml_file_parses() -> None:
    files = list(iter_yaml_files())
    assert len(files) >= 20
    for path in files:
        assert load_docs(path), f"{rel(path)} is empty"


def test_readme_describes_every_file() -> None:
    readme = (DEPLOY / "README.md").read_text()
    for path in DEPLOY.rglob("*"):
        if path.is_file() and path.name != "README.md":
            name = str(path.relative_to(DEPLOY))
            in_its_directory = (
                f"{path.parent.relative_to(DEPLOY)}/" in readme and path.name in readme
            )
            assert name in readme or in_its_directory, f"deploy/README.md does not describe {name}"


def test_every_kubernetes_file_is_used_by_a_kustomization(builds: dict[str, Build]) -> None:
    used = set().union(*(b.files for b in builds.values()))
    for path in KUBE.rglob("*.yaml"):
        if path.parent.name != "examples":
            assert path.resolve() in used, f"{rel(path)} is in no kustomization"


@pytest.mark.parametrize("root", KUSTOMIZATIONS, ids=IDS)
def test_kustomization_images_name_a_container_image(root: Path) -> None:
    build = resolve(root)
    used = {
        c["image"].rsplit(":", 1)[0]
        for obj in build.objects.values()
        for c in containers(pod_spec(obj) or {})
    }
    for name in build.images:
        assert name in used, f"{rel(root)}: images: {name} matches no container"


@needs_kubectl
@pytest.mark.parametrize("root", KUSTOMIZATIONS, ids=IDS)
def test_kustomize_renders_what_the_resolver_predicts(
    root: Path, rendered: dict[str, list[dict[str, Any]]], builds: dict[str, Build]
) -> None:
    assert {obj_key(o) for o in rendered[root.name]} == set(builds[root.name].objects)


@needs_kubectl
@pytest.mark.parametrize("root", OVERLAYS, ids=[p.name for p in OVERLAYS])
def test_overlay_sets_namespace_and_image(
    root: Path, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    k = load_one(root / "kustomization.yaml")
    (image,) = k["images"]
    for obj in rendered[root.name]:
        assert obj["metadata"]["namespace"] == k["namespace"], obj_key(obj)
        for subject in obj.get("subjects", []):
            assert subject["namespace"] == k["namespace"], obj_key(obj)
        pod = pod_spec(obj)
        for c in containers(pod) if pod else []:
            if mounts_config_map(pod, c, CONFIG_MAP):
                assert c["image"] == f"{image['newName']}:{image['newTag']}"


@needs_kubectl
def test_sidecar_overlay_has_no_shared_proxy(rendered: dict[str, list[dict[str, Any]]]) -> None:
    names = {obj_key(o) for o in rendered["sidecar"]}
    shared = {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"}
    shared |= {"ServiceMonitor", "PrometheusRule"}
    assert not {(kind, "prefix-proxy") for kind in shared} & names
    assert ("Deployment", "agent") in names
    (cm,) = [o for o in rendered["sidecar"] if o["kind"] == "ConfigMap"]
    assert yaml.safe_load(cm["data"]["config.yaml"])["listen"]["host"] == "127.0.0.1"


# Schemas


def _schema_errors(objs: list[tuple[str, dict[str, Any]]], version: str) -> list[str]:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed")
    jsonschema = pytest.importorskip("jsonschema")
    errors = []
    for where, obj in objs:
        try:
            kv.validate(obj, version, strict=True)
        except kv.SchemaNotFoundError:
            schema = CRD_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
            if schema is None:
                errors.append(f"{where}: no schema for {obj['apiVersion']} {obj['kind']}")
                continue
            for e in jsonschema.Draft202012Validator(schema).iter_errors(obj):
                errors.append(f"{where}: {e.json_path}: {e.message}")
        except kv.ValidationError as e:
            errors.append(f"{where}: {str(e).splitlines()[0]}")
    return errors


def _written_objects(builds: dict[str, Build]) -> list[tuple[str, dict[str, Any]]]:
    objs = [
        (f"{name}: {obj_key(o)}", o)
        for name, b in builds.items()
        for o in b.objects.values()
        if "apiVersion" in o  # generated ConfigMaps are checked rendered
    ]
    for path in EXAMPLES:
        objs += [(f"{rel(path)}: {obj_key(o)}", o) for o in load_docs(path)]
    return objs


@pytest.mark.parametrize("version", [OLDEST_K8S, "latest"])
def test_manifests_as_written_validate(builds: dict[str, Build], version: str) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed")
    version = kv.latest_version() if version == "latest" else version
    objs = _written_objects(builds)
    assert {o["kind"] for _, o in objs} >= {"Deployment", "Service", "ServiceMonitor"}
    assert _schema_errors(objs, version) == []


@needs_kubectl
@pytest.mark.parametrize("version", [OLDEST_K8S, "latest"])
def test_rendered_manifests_validate(
    rendered: dict[str, list[dict[str, Any]]], version: str
) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed")
    version = kv.latest_version() if version == "latest" else version
    objs = [(f"{name}: {obj_key(o)}", o) for name, docs in rendered.items() for o in docs]
    assert _schema_errors(objs, version) == []


def test_schema_check_catches_a_misspelt_field(builds: dict[str, Build]) -> None:
    deployment = json.loads(json.dumps(builds["base"].objects[("Deployment", "prefix-proxy")]))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    monitor = json.loads(json.dumps(builds["base"].objects[("ServiceMonitor", "prefix-proxy")]))
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    errors = _schema_errors([("d", deployment), ("m", monitor)], OLDEST_K8S)
    assert len(errors) == 2 and "readinesProbe" in errors[0] and "intervall" in errors[1]


# Wiring between the objects


@pytest.mark.parametrize("name", IDS)
def test_selectors_ports_and_references_line_up(builds: dict[str, Build], name: str) -> None:
    objs = builds[name].objects
    pods = {k[1]: o for k, o in objs.items() if k[0] == "Deployment"}
    for dep in pods.values():
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert labels_match(dep["spec"]["selector"]["matchLabels"], labels)
    for (kind, oname), obj in objs.items():
        if kind == "Service":
            (dep,) = [
                d
                for d in pods.values()
                if labels_match(
                    obj["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"]
                )
            ]
            ports = {p["name"] for c in containers(pod_spec(dep)) for p in c.get("ports", [])}
            for port in obj["spec"]["ports"]:
                assert port["targetPort"] in ports, f"Service {oname}: {port}"
        if kind == "PodDisruptionBudget":
            sel = obj["spec"]["selector"]["matchLabels"]
            assert any(
                labels_match(sel, d["spec"]["template"]["metadata"]["labels"])
                for d in pods.values()
            )
        if kind == "HorizontalPodAutoscaler":
            assert obj["spec"]["scaleTargetRef"]["name"] in pods
            assert obj["spec"]["minReplicas"] >= 2
        if kind == "ServiceMonitor":
            (svc,) = [
                o
                for k, o in objs.items()
                if k[0] == "Service"
                and labels_match(obj["spec"]["selector"]["matchLabels"], o["metadata"]["labels"])
            ]
            for endpoint in obj["spec"]["endpoints"]:
                assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}
        pod = pod_spec(obj)
        for c in containers(pod) if pod else []:
            named = {p["name"] for p in c.get("ports", [])}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                action = c.get(probe, {})
                for how in ("httpGet", "tcpSocket"):
                    if how in action:
                        assert action[how]["port"] in named, f"{oname}/{c['name']} {probe}"


def test_shared_proxy_runs_at_least_two_replicas(builds: dict[str, Build]) -> None:
    assert builds["base"].objects[("Deployment", "prefix-proxy")]["spec"]["replicas"] >= 2


@pytest.mark.parametrize("name", IDS)
def test_pods_are_locked_down(builds: dict[str, Build], name: str) -> None:
    for obj in builds[name].objects.values():
        pod = pod_spec(obj)
        if pod is None:
            continue
        assert pod["securityContext"]["runAsNonRoot"] is True, obj_key(obj)
        for c in containers(pod):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
            assert c["resources"]["requests"], c["name"]


@pytest.mark.parametrize("name", IDS)
def test_discovery_is_allowed_to_watch_endpoint_slices(
    builds: dict[str, Build], configs: dict[str, LoadedConfig], name: str
) -> None:
    objs = builds[name].objects
    assert configs[name].config.backends.kubernetes is not None
    binding = objs[("RoleBinding", "prefix-proxy-discovery")]
    role = objs[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
    assert any(
        "discovery.k8s.io" in r["apiGroups"]
        and "endpointslices" in r["resources"]
        and {"get", "list", "watch"} <= set(r["verbs"])
        for r in role["rules"]
    )
    accounts = {s["name"] for s in binding["subjects"] if s["kind"] == "ServiceAccount"}
    assert all(("ServiceAccount", a) in objs for a in accounts)
    proxies = list(proxy_containers(builds[name]))
    assert proxies
    for _, pod, _, _ in proxies:
        assert pod["serviceAccountName"] in accounts


def test_discovery_names_the_example_engine_service(configs: dict[str, LoadedConfig]) -> None:
    services = {
        o["metadata"]["name"]: o for p in EXAMPLES for o in load_docs(p) if o["kind"] == "Service"
    }
    for loaded in configs.values():
        k = loaded.config.backends.kubernetes
        assert k is not None and k.service in services
        assert k.port_name in {p["name"] for p in services[k.service]["spec"]["ports"]}


# The ConfigMap's config against the code


@pytest.mark.parametrize("name", IDS)
def test_config_map_config_and_policy_pass_check_config(
    tmp_path: Path, builds: dict[str, Build], name: str
) -> None:
    files = builds[name].config_maps[CONFIG_MAP]
    assert yaml.safe_load(files["config.yaml"].read_text())["policy"] in files
    for key in ("config.yaml", "policy.yaml"):
        (tmp_path / key).write_text(files[key].read_text())
    for key, says in (("policy.yaml", "ok: policy"), ("config.yaml", "ok: config")):
        out = subprocess.run(
            [sys.executable, "-m", "proxy.cli", "check-config", str(tmp_path / key)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 0 and out.stdout.startswith(says), out.stderr


def test_check_config_rejects_a_broken_policy(tmp_path: Path, builds: dict[str, Build]) -> None:
    policy = builds["base"].config_maps[CONFIG_MAP]["policy.yaml"].read_text()
    (tmp_path / "policy.yaml").write_text(policy.replace("bounded_load", "bounded_lode"))
    out = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", str(tmp_path / "policy.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2 and "picker.name" in out.stderr


@pytest.mark.parametrize("name", IDS)
def test_proxy_ports_hosts_and_mounts_match_the_config(
    builds: dict[str, Build], configs: dict[str, LoadedConfig], name: str
) -> None:
    listen = configs[name].config.listen
    entrypoint = " ".join(json.loads(instruction("ENTRYPOINT")))
    for _, _, c, mount in proxy_containers(builds[name]):
        assert f"--config {mount}/config.yaml" in entrypoint
        ports = c.get("ports", [])
        if ports:  # served to the cluster: every interface, on the declared port
            assert listen.host == "0.0.0.0"
            assert [p["containerPort"] for p in ports] == [listen.port]
        else:  # a sidecar: only its own pod reaches it
            assert listen.host == "127.0.0.1"
        for url in _probe_urls(c):
            assert (url.hostname, url.port) == ("127.0.0.1", listen.port)


def test_sidecar_agent_talks_to_its_proxy(
    builds: dict[str, Build], configs: dict[str, LoadedConfig]
) -> None:
    listen = configs["sidecar"].config.listen
    agent = builds["sidecar"].objects[("Deployment", "agent")]
    (app,) = pod_spec(agent)["containers"]
    env = {e["name"]: e.get("value") for e in app["env"]}
    assert env["OPENAI_BASE_URL"] == f"http://{listen.host}:{listen.port}/v1"
    (proxy,) = pod_spec(agent)["initContainers"]
    assert proxy["restartPolicy"] == "Always"  # a native sidecar


@pytest.mark.parametrize("name", IDS)
def test_drain_fits_in_the_grace_period(
    builds: dict[str, Build], configs: dict[str, LoadedConfig], name: str
) -> None:
    drain = configs[name].config.limits.drain_timeout_s
    for _, pod, c, _ in proxy_containers(builds[name]):
        pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
        wait = float(pre_stop[1]) if pre_stop else 0.0
        assert pod["terminationGracePeriodSeconds"] >= wait + drain + 5


@pytest.mark.parametrize("name", IDS)
def test_redis_url_names_the_redis_service(
    builds: dict[str, Build], configs: dict[str, LoadedConfig], name: str
) -> None:
    url = urlparse(configs[name].config.cluster.redis_url)
    service = builds[name].objects[("Service", url.hostname)]
    assert url.port in {p["port"] for p in service["spec"]["ports"]}


@pytest.mark.parametrize("name", IDS)
def test_env_given_to_the_proxy_is_env_the_config_reads(
    builds: dict[str, Build], configs: dict[str, LoadedConfig], name: str
) -> None:
    cfg = configs[name].config
    read = {cfg.admin.token_env, cfg.auth.api_keys_env, cfg.upstream.token_env}
    for _, _, c, _ in proxy_containers(builds[name]):
        for env in c.get("env", []):
            assert env["name"] in read, f"{c['name']} sets {env['name']}, which nothing reads"


def test_images_carry_the_project_version(builds: dict[str, Build]) -> None:
    for name, build in builds.items():
        for _, _, c, _ in proxy_containers(build):
            assert c["image"] == f"prefix-proxy:{project_version()}", name
    for root in OVERLAYS:
        for image in load_one(root / "kustomization.yaml")["images"]:
            assert image["newTag"] == project_version()


# Against the running proxy


@pytest.mark.parametrize("name", IDS)
def test_probes_pass_and_fail_when_they_should(
    builds: dict[str, Build], live: Callable[[str], RunningProxy], name: str
) -> None:
    """Run each probe against the proxy serving this config with no engine reachable:
    liveness and startup must pass (a restart would not bring the engines back), readiness
    must fail (the proxy leaves the Service rather than answer 503s)."""
    proxy = live(name)
    tried = 0
    for _, _, c, _ in proxy_containers(builds[name]):
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            if probe not in c:
                continue
            expected = 503 if probe == "readinessProbe" else 200
            action = c[probe]
            if "httpGet" in action:
                path = action["httpGet"]["path"]
            else:
                command = action["exec"]["command"]
                (url,) = _probe_urls({probe: action})
                path = url.path
                exit_code = _run_exec_probe(command, proxy.port)
                assert (exit_code == 0) is (expected == 200), f"{c['name']} {probe}"
            assert http_get(proxy.url + path) == expected, f"{c['name']} {probe} {path}"
            tried += 1
    assert tried >= 2


def test_service_monitor_path_serves_metrics(
    builds: dict[str, Build], live: Callable[[str], RunningProxy]
) -> None:
    monitor = builds["base"].objects[("ServiceMonitor", "prefix-proxy")]
    for endpoint in monitor["spec"]["endpoints"]:
        text = http_text(live("base").url + endpoint["path"])
        assert "prefix_proxy_requests_total" in text


def test_rule_and_dashboard_metrics_exist(live: Callable[[str], RunningProxy]) -> None:
    exposed = _series_names(http_text(live("base").url + "/metrics"))
    sources = [ALERTS, KUBE / "base" / "prometheusrule.yaml"]
    if DASHBOARD.exists():
        sources.append(DASHBOARD)
    for source in sources:
        used = set(re.findall(r"(?<![\w:])prefix_proxy_\w+", source.read_text()))
        assert len(used) >= 5, rel(source)
        assert used <= exposed, f"{rel(source)} uses {sorted(used - exposed)}"


def test_prometheus_rule_carries_the_rule_file() -> None:
    rule = load_one(BASE / "prometheusrule.yaml")
    alerts = load_one(ALERTS)
    assert rule["spec"]["groups"] == alerts["groups"]


def test_rule_file_validates() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(load_one(ALERTS), PROMETHEUS_RULE["properties"]["spec"])


# Helpers


def _probe_urls(c: dict[str, Any]) -> list[ParseResult]:
    urls = []
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        command = c.get(probe, {}).get("exec", {}).get("command")
        if command:
            urls += urls_in(" ".join(command))
    return urls


def _run_exec_probe(command: list[str], port: int) -> int:
    """The probe's command as the kubelet runs it in the container, pointed at ``port``."""
    assert command[0] == "python"
    code = [part.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for part in command[1:]]
    return subprocess.run([sys.executable, *code], capture_output=True, timeout=30).returncode


def _series_names(exposition: str) -> set[str]:
    """Every series name a scrape of this exposition yields, by metric type."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("", "_sum", "_count", "_created"),
        "gauge": ("",),
    }
    names = set()
    for family in text_string_to_metric_families(exposition):
        names |= {family.name + s for s in suffixes.get(family.type, ("",))}
    return names
