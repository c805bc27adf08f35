"""What the deploy tests share: the files under deploy/, a small Kustomize resolver, and the
proxy started as a real process from one of deploy/'s configs.

Nothing in deploy/ can run here (no container engine, no cluster), so the tests hold every
port, path, name and key in those files against the code and against each other, and run the
parts that can run: the proxy with each shipped config, the image's entrypoint and health
check, the probes' commands.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import ParseResult, urlparse

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUBE = DEPLOY / "kubernetes"
BASE = KUBE / "base"
OVERLAYS = sorted(p for p in (KUBE / "overlays").iterdir() if p.is_dir())
KUSTOMIZATIONS = [BASE, *OVERLAYS]
EXAMPLES = sorted((KUBE / "examples").glob("*.yaml"))
COMPOSE = DEPLOY / "compose"
CONTAINERFILE = DEPLOY / "Containerfile"
IMAGE_CONFIG = DEPLOY / "container" / "config.yaml"
DASHBOARD = DEPLOY / "grafana" / "prefix-proxy.json"
CONFIG_MAP = "prefix-proxy"


def load_docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def load_one(path: Path) -> Any:
    (doc,) = load_docs(path)
    return doc


def project_version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


# Kubernetes objects


def obj_key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return obj["spec"]["template"]["spec"]
    return None


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def mounts_config_map(pod: dict[str, Any], container: dict[str, Any], name: str) -> str | None:
    """Where ``container`` mounts the ConfigMap ``name``, if it does."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for m in container.get("volumeMounts", []):
        if volumes.get(m["name"], {}).get("configMap", {}).get("name") == name:
            return m["mountPath"]
    return None


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@dataclass
class Build:
    """A kustomization's inputs resolved as kustomize resolves them: the objects it emits
    (by kind and name), the files of its generated ConfigMaps, and every file it reads."""

    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    config_maps: dict[str, dict[str, Path]] = field(default_factory=dict)
    files: set[Path] = field(default_factory=set)
    images: list[str] = field(default_factory=list)


def resolve(root: Path) -> Build:
    """Follow ``resources``, ``configMapGenerator`` and ``patches``, checking as it goes that
    every file exists and every patch and generator merge targets an object that exists."""
    kfile = root / "kustomization.yaml"
    k = load_one(kfile)
    build = Build(files={kfile.resolve()})
    for entry in k.get("resources", []):
        path = (root / entry).resolve()
        assert path.exists(), f"{rel(kfile)}: resource {entry} does not exist"
        if path.is_dir():
            sub = resolve(path)
            clash = build.objects.keys() & sub.objects.keys()
            assert not clash, f"{rel(kfile)}: {entry} emits {clash} again"
            build.objects |= sub.objects
            build.config_maps |= sub.config_maps
            build.files |= sub.files
            continue
        build.files.add(path)
        for obj in load_docs(path):
            key = obj_key(obj)
            assert key not in build.objects, f"{rel(path)}: {key} defined twice"
            build.objects[key] = obj
    for gen in k.get("configMapGenerator", []):
        files: dict[str, Path] = {}
        for spec in gen.get("files", []):
            key, _, name = spec.rpartition("=")
            path = (root / name).resolve()
            assert path.is_file(), f"{rel(kfile)}: generator file {name} does not exist"
            files[key or Path(name).name] = path
            build.files.add(path)
        behavior = gen.get("behavior", "create")
        name = gen["name"]
        if behavior == "create":
            assert name not in build.config_maps, f"{rel(kfile)}: ConfigMap {name} exists"
            build.config_maps[name] = files
            build.objects[("ConfigMap", name)] = {"kind": "ConfigMap", "metadata": {"name": name}}
        else:
            assert name in build.config_maps, f"{rel(kfile)}: {behavior} of unknown {name}"
            old = build.config_maps[name] if behavior == "merge" else {}
            build.config_maps[name] = old | files
    for patch in k.get("patches", []):
        if "path" in patch:
            path = (root / patch["path"]).resolve()
            assert path.is_file(), f"{rel(kfile)}: patch {patch['path']} does not exist"
            build.files.add(path)
            docs = load_docs(path)
        else:
            docs = [d for d in yaml.safe_load_all(patch["patch"]) if d is not None]
        for doc in docs:
            key = obj_key(doc)
            assert key in build.objects, f"{rel(kfile)}: a patch targets {key}, which is absent"
            if doc.get("$patch") == "delete":
                del build.objects[key]
    build.images = [i["name"] for i in k.get("images", [])]
    return build


def kubectl() -> str | None:
    return shutil.which("kubectl")


def render(root: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize`` (kustomize built into kubectl): the real rendering."""
    exe = kubectl()
    assert exe is not None
    out = subprocess.run(
        [exe, "kustomize", str(root)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, f"kubectl kustomize {rel(root)} failed:\n{out.stderr[-3000:]}"
    return [d for d in yaml.safe_load_all(out.stdout) if d is not None]


def materialize(files: dict[str, Path], into: Path) -> Path:
    """Write a ConfigMap's files into a directory the way the kubelet mounts them; returns
    the path of its config.yaml."""
    into.mkdir(parents=True, exist_ok=True)
    for key, path in files.items():
        (into / key).write_text(path.read_text())
    return into / "config.yaml"


def config_map_config(root: Path, into: Path) -> Path:
    return materialize(resolve(root).config_maps[CONFIG_MAP], into)


# The proxy as a real process


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 10.0, headers: dict[str, str] | None = None) -> int:
    """The status of a GET (an HTTP error status included); 0 when nothing answered."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return 0


def http_text(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def urls_in(text: str) -> list[ParseResult]:
    """The http URLs written in ``text`` (a probe's or a health check's command)."""
    return [urlparse(u) for u in re.findall(r"http://[^'\"\s]+", text)]


def prefix_proxy_argv(argv: list[str]) -> list[str]:
    """An image's ``prefix-proxy ...`` command as this interpreter runs it: the console script
    pyproject declares, without needing it installed."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, func = scripts[argv[0]].partition(":")
    assert func == "main", scripts
    return [sys.executable, "-m", module, *argv[1:]]


@dataclass
class RunningProxy:
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def running_proxy(
    argv: list[str], workdir: Path, env: dict[str, str] | None = None
) -> Iterator[RunningProxy]:
    """Run a ``serve`` command line on a free loopback port (``--host``/``--port`` appended,
    as a user overrides the config's listen address) until /health answers; SIGTERM on exit."""
    port = free_port()
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), full_env.get("PYTHONPATH")]))
    log = workdir / f"proxy-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*argv, "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=workdir,
        )
    running = RunningProxy(f"http://127.0.0.1:{port}", port, proc, log)
    try:
        deadline = time.monotonic() + 60.0  # generous: CI machines are small and busy
        while http_get(running.url + "/health", timeout=1.0) != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"proxy did not start: {argv}\n{running.logs()}")
            time.sleep(0.05)
        yield running
    finally:
        running.stop()


def serve_config(
    config_path: Path, env: dict[str, str] | None = None
) -> AbstractContextManager[RunningProxy]:
    """The proxy serving ``config_path`` (a context manager yielding a RunningProxy)."""
    argv = prefix_proxy_argv(["prefix-proxy", "serve", "--config", str(config_path)])
    return running_proxy(argv, config_path.parent, env)


def hermetic(config_path: Path) -> None:
    """Rewrite a deploy config so it runs on this machine: no cluster to discover engines in
    and no Redis to share with (both are tested where they live). Everything else stays."""
    data = yaml.safe_load(config_path.read_text())
    data["backends"] = {"static": []}
    data.pop("cluster", None)
    config_path.write_text(yaml.safe_dump(data))


def containerfile() -> list[tuple[str, str]]:
    """The Containerfile's instructions in order, as (INSTRUCTION, arguments); continuation
    lines joined, comments dropped."""
    out = []
    pending = ""
    for raw in CONTAINERFILE.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or not (line or pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        word, _, args = (pending + line).strip().partition(" ")
        out.append((word.upper(), args.strip()))
        pending = ""
    return out


def instruction(name: str) -> str:
    """The arguments of the one ``name`` instruction."""
    (args,) = [a for word, a in containerfile() if word == name]
    return args


def iter_yaml_files() -> Iterator[Path]:
    for pattern in ("*.yaml", "*.yml"):
        yield from sorted(DEPLOY.rglob(pattern))
