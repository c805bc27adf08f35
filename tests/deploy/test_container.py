"""The Containerfile: what it copies exists, it runs as the user the pods expect, and its
entrypoint and health check work. No container engine here, so the entrypoint runs as the
image would run it (its command line, its baked-in config) and the health check's own
command is pointed at it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.config import load_config
from tests.deploy.support import (
    CONTAINERFILE,
    IMAGE_CONFIG,
    KUSTOMIZATIONS,
    REPO,
    RunningProxy,
    containerfile,
    containers,
    http_get,
    instruction,
    pod_spec,
    prefix_proxy_argv,
    resolve,
    running_proxy,
    urls_in,
)

API_KEY = "deploy-test-key"


@pytest.fixture
def image_proxy(tmp_path: Path) -> Iterator[RunningProxy]:
    """The image's ENTRYPOINT with its baked-in config (copied where the image puts it,
    under a temporary root) and a client API key in the environment, as `docker run -e`."""
    entrypoint = json.loads(instruction("ENTRYPOINT"))
    src, dest = _copied_config()
    config = tmp_path / dest.lstrip("/")
    config.parent.mkdir(parents=True)
    config.write_text((REPO / src).read_text())
    argv = [str(config) if a == dest else a for a in entrypoint]
    assert argv != entrypoint, "the ENTRYPOINT does not read the config the image copies"
    env = {"PREFIX_PROXY_API_KEYS": API_KEY}
    with running_proxy(prefix_proxy_argv(argv), tmp_path, env) as p:
        yield p


def _copied_config() -> tuple[str, str]:
    (copy,) = [a for word, a in containerfile() if word == "COPY" and a.endswith("config.yaml")]
    src, dest = copy.split()
    return src, dest


def _healthcheck_command() -> list[str]:
    _, _, command = instruction("HEALTHCHECK").partition("CMD ")
    return json.loads(command)


def test_base_image_is_slim_python_the_project_supports() -> None:
    (base,) = [a for word, a in containerfile() if word == "FROM"]
    assert base == "python:3.11-slim"


def test_every_copied_path_exists() -> None:
    copies = [a.split() for word, a in containerfile() if word == "COPY"]
    assert len(copies) >= 5
    for *sources, _ in copies:
        for source in sources:
            assert (REPO / source).exists(), f"COPY {source}: not in the repository"


def test_image_config_is_the_one_it_documents() -> None:
    src, _ = _copied_config()
    assert REPO / src == IMAGE_CONFIG
    cfg = load_config(IMAGE_CONFIG).config
    assert cfg.listen.host == "0.0.0.0"
    assert instruction("EXPOSE") == str(cfg.listen.port)
    (url,) = urls_in(" ".join(_healthcheck_command()))
    assert url.port == cfg.listen.port
    documented = set(re.findall(r"\bPREFIX_PROXY_[A-Z_]+", CONTAINERFILE.read_text()))
    assert documented == {cfg.admin.token_env, cfg.auth.api_keys_env, cfg.upstream.token_env}


def test_runs_as_the_user_every_proxy_pod_expects() -> None:
    user, _, group = instruction("USER").partition(":")
    assert int(user) > 0 and int(group) > 0
    pods = 0
    for root in KUSTOMIZATIONS:
        for obj in resolve(root).objects.values():
            pod = pod_spec(obj)
            if pod and any(c["image"].startswith("prefix-proxy:") for c in containers(pod)):
                sc = pod["securityContext"]
                assert (sc["runAsUser"], sc["runAsGroup"]) == (int(user), int(group))
                pods += 1
    assert pods >= 2


def test_entrypoint_serves_and_reads_secrets_from_the_environment(
    image_proxy: RunningProxy,
) -> None:
    assert http_get(image_proxy.url + "/health") == 200
    assert http_get(image_proxy.url + "/v1/models") == 401
    auth = {"Authorization": f"Bearer {API_KEY}"}
    assert http_get(image_proxy.url + "/v1/models", headers=auth) == 200


def test_healthcheck_command_passes_then_fails_when_the_proxy_stops(
    image_proxy: RunningProxy,
) -> None:
    command = _healthcheck_command()
    assert command[0] == "python"
    code = [c.replace("127.0.0.1:8000", f"127.0.0.1:{image_proxy.port}") for c in command[1:]]

    def check() -> int:
        return subprocess.run([sys.executable, *code], capture_output=True, timeout=30).returncode

    assert check() == 0
    image_proxy.stop()
    assert check() != 0


def test_policy_presets_ship_with_the_install() -> None:
    """The image pip-installs the project, whose wheel carries policies/*.yaml as data files
    (pyproject's data-files); the config's preset must be one of them."""
    run = instruction("RUN")
    assert "pip install ." in run
    data_files = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "data-files"
    ]
    assert data_files["share/prefix-proxy/policies"] == ["policies/*.yaml"]
    copies = [a.split() for word, a in containerfile() if word == "COPY"]
    assert ["policies/", "policies/"] in copies and ["proxy/", "proxy/"] in copies
    preset = load_config(IMAGE_CONFIG).config.policy
    assert isinstance(preset, str) and Path(REPO / "policies" / f"{preset}.yaml").is_file()
