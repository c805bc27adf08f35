"""YAML -> typed, validated configuration, with errors that name the key path and line.

Every section is a frozen dataclass whose fields and defaults are the documentation of what
the proxy accepts; ``load_config`` checks types against the annotations so a typo or a wrong
type is reported as ``config.yaml:12: upstream.max_attempts: expected an integer, got 'x'``
and the proxy refuses to start (or, on reload, keeps the old config).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from proxy.routing.policy import Policy, PolicyError, build_policy

# Presets: the repository's policies/ (source checkouts, editable installs), else where a
# wheel install puts them.
POLICY_DIRS = (
    Path(__file__).resolve().parent.parent / "policies",
    Path(sys.prefix) / "share" / "prefix-proxy" / "policies",
)


class ConfigError(ValueError):
    """An invalid configuration, located by key path (and line when read from a file)."""

    def __init__(self, path: str, message: str, source: str | None = None, line: int | None = None):
        where = f"{source}:{line}: " if source and line else (f"{source}: " if source else "")
        super().__init__(f"{where}{path}: {message}" if path else f"{where}{message}")
        self.path = path
        self.source = source


@dataclass(frozen=True, slots=True)
class ListenConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1


@dataclass(frozen=True, slots=True)
class DnsDiscoveryConfig:
    name: str = ""
    port: int = 8000
    scheme: str = "http"
    srv: bool = False
    interval_s: float = 10.0
    nameserver: str | None = None


@dataclass(frozen=True, slots=True)
class KubernetesDiscoveryConfig:
    """EndpointSlices of ``service``; in a pod the defaults read the service account."""

    service: str = ""
    namespace: str | None = None
    port_name: str | None = None
    scheme: str = "http"
    api_server: str | None = None
    token_path: str = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    ca_path: str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"


@dataclass(frozen=True, slots=True)
class BackendsConfig:
    static: list[str] = field(default_factory=list)
    dns: DnsDiscoveryConfig | None = None
    kubernetes: KubernetesDiscoveryConfig | None = None


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Where a model's chat template comes from (else: the backend's, else built-in)."""

    chat_template: str | None = None
    chat_template_file: str | None = None
    tokenizer_config: str | None = None


@dataclass(frozen=True, slots=True)
class PromptSettings:
    block_chars: int = 128
    max_blocks: int = 8192
    chars_per_token: float = 4.0
    session_header: str = "X-Session-ID"
    tenant_header: str | None = None
    tenant_salt: str | None = None


@dataclass(frozen=True, slots=True)
class IndexConfig:
    default_capacity_tokens: int = 1_048_576


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    max_attempts: int = 3
    connect_timeout_s: float = 3.0
    first_byte_timeout_s: float = 300.0
    read_timeout_s: float = 300.0
    authorization: Literal["pass", "replace", "drop"] = "pass"
    token: str | None = None
    token_env: str | None = None


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_body_bytes: int = 32 * 1024 * 1024
    max_header_bytes: int = 16384
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keepalive_timeout_s: float = 75.0
    drain_timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class HealthConfig:
    interval_s: float = 5.0
    timeout_s: float = 2.0
    eject_after_failures: int = 3
    backoff_base_s: float = 1.0
    backoff_max_s: float = 30.0
    models_interval_s: float = 30.0


@dataclass(frozen=True, slots=True)
class ScrapeConfig:
    interval_s: float = 1.0
    timeout_s: float = 1.0
    stale_after_s: float = 5.0


@dataclass(frozen=True, slots=True)
class AdminConfig:
    token: str | None = None
    token_env: str = "PREFIX_PROXY_ADMIN_TOKEN"


@dataclass(frozen=True, slots=True)
class AuthConfig:
    api_keys: list[str] = field(default_factory=list)
    api_keys_env: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    redis_url: str | None = None
    redis_url_env: str | None = None
    key_prefix: str = "prefix-proxy"
    flush_interval_s: float = 0.05
    max_batch: int = 512
    snapshot_interval_s: float = 10.0
    snapshot_blocks: int = 65536
    snapshot_ttl_s: float = 300.0
    share_inflight: bool = False


@dataclass(frozen=True, slots=True)
class TracingConfig:
    exporter: Literal["none", "console", "otlp"] = "none"
    endpoint: str | None = None
    sample_ratio: float = 1.0
    service_name: str = "prefix-proxy"


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    tracing: TracingConfig = field(default_factory=TracingConfig)
    access_log: bool = True
    debug_header: bool = False
    recent_decisions: int = 50


@dataclass(frozen=True, slots=True)
class Config:
    listen: ListenConfig = field(default_factory=ListenConfig)
    backends: BackendsConfig = field(default_factory=BackendsConfig)
    models: dict[str, ModelConfig] = field(default_factory=dict)
    prompt: PromptSettings = field(default_factory=PromptSettings)
    policy: str | dict[str, Any] = "default"
    index: IndexConfig = field(default_factory=IndexConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    scrape: ScrapeConfig = field(default_factory=ScrapeConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)

    def admin_token(self) -> str | None:
        return self.admin.token or os.environ.get(self.admin.token_env) or None

    def api_keys(self) -> frozenset[str]:
        keys = set(self.auth.api_keys)
        if self.auth.api_keys_env and os.environ.get(self.auth.api_keys_env):
            keys.update(k.strip() for k in os.environ[self.auth.api_keys_env].split(",") if k)
        return frozenset(keys)

    def cluster_redis_url(self) -> str | None:
        """The Redis URL, from the environment variable named by redis_url_env if set."""
        c = self.cluster
        return (os.environ.get(c.redis_url_env) if c.redis_url_env else None) or c.redis_url

    def upstream_token(self) -> str | None:
        u = self.upstream
        return u.token or (os.environ.get(u.token_env) if u.token_env else None)


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    """A validated config with its policy built, where both came from, and the command-line
    overrides applied on top (kept so that a reload of the file applies them again)."""

    config: Config
    policy: Policy
    source: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> LoadedConfig:
    """Read a YAML file (or none: defaults) and apply ``overrides`` (dotted keys) on top."""
    if path is None:
        return parse_config("", overrides=overrides)
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError("", f"cannot read config: {e.strerror}", str(path)) from e
    return parse_config(text, source=str(path), base_dir=path.parent, overrides=overrides)


def parse_config(
    text: str,
    source: str | None = None,
    base_dir: Path | None = None,
    overrides: dict[str, Any] | None = None,
) -> LoadedConfig:
    data, lines = load_yaml(text, source)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("", "the config file must be a YAML mapping", source, 1)
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    try:
        config = _build(Config, data, "")
        _check(config)
        policy = resolve_policy(config.policy, base_dir)
    except ConfigError as e:
        if e.source is not None:  # already located, in a policy file of its own
            raise
        raise ConfigError(e.path, _detail(e), source, _line_for(lines, e.path)) from None
    return LoadedConfig(config=config, policy=policy, source=source, overrides=overrides or {})


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = data
    for key in parents:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[last] = value


def resolve_policy(ref: str | dict[str, Any], base_dir: Path | None) -> Policy:
    """A preset name (policies/NAME.yaml), a path to a policy file, or an inline mapping."""
    if isinstance(ref, dict):
        return _policy_or_error(ref, "policy")
    candidates = [Path(ref)]
    if base_dir is not None:
        candidates.append(base_dir / ref)
    candidates += [d / f"{ref}.yaml" for d in POLICY_DIRS]
    for p in candidates:
        if p.is_file():
            data, lines = load_yaml(p.read_text(), str(p))
            try:
                return _policy_or_error(data, "")
            except ConfigError as e:
                raise ConfigError(e.path, _detail(e), str(p), _line_for(lines, e.path)) from None
    presets = sorted({f.stem for d in POLICY_DIRS for f in d.glob("*.yaml")})
    raise ConfigError("policy", f"no preset or file named {ref!r}; presets: {presets}")


def _policy_or_error(data: Any, prefix: str) -> Policy:
    try:
        return build_policy(data)
    except PolicyError as e:
        path = ".".join(p for p in (prefix, e.path) if p)
        raise ConfigError(path, e.detail) from None


def _check(config: Config) -> None:
    """Cross-field and range checks the type annotations cannot express."""
    positive = {
        "listen.workers": config.listen.workers,
        "prompt.block_chars": config.prompt.block_chars,
        "prompt.max_blocks": config.prompt.max_blocks,
        "prompt.chars_per_token": config.prompt.chars_per_token,
        "upstream.max_attempts": config.upstream.max_attempts,
        "upstream.connect_timeout_s": config.upstream.connect_timeout_s,
        "upstream.first_byte_timeout_s": config.upstream.first_byte_timeout_s,
        "upstream.read_timeout_s": config.upstream.read_timeout_s,
        "limits.max_body_bytes": config.limits.max_body_bytes,
        "limits.header_timeout_s": config.limits.header_timeout_s,
        "limits.body_timeout_s": config.limits.body_timeout_s,
        "limits.keepalive_timeout_s": config.limits.keepalive_timeout_s,
        "health.interval_s": config.health.interval_s,
        "health.timeout_s": config.health.timeout_s,
        "health.eject_after_failures": config.health.eject_after_failures,
        "scrape.interval_s": config.scrape.interval_s,
        "scrape.timeout_s": config.scrape.timeout_s,
        "index.default_capacity_tokens": config.index.default_capacity_tokens,
        "cluster.max_batch": config.cluster.max_batch,
    }
    for path, value in positive.items():
        if value <= 0:
            raise ConfigError(path, f"must be > 0, got {value}")
    if not 0 <= config.listen.port <= 65535:
        raise ConfigError("listen.port", "must be in 0..65535")
    if not 0.0 <= config.telemetry.tracing.sample_ratio <= 1.0:
        raise ConfigError("telemetry.tracing.sample_ratio", "must be in 0..1")
    for i, url in enumerate(config.backends.static):
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"backends.static[{i}]", f"must be an http(s) URL, got {url!r}")
    if config.upstream.authorization == "replace" and not config.upstream_token():
        raise ConfigError("upstream.token", "required when upstream.authorization is 'replace'")
    for name, model in config.models.items():
        given = [model.chat_template, model.chat_template_file, model.tokenizer_config]
        if sum(x is not None for x in given) > 1:
            raise ConfigError(
                f"models.{name}", "give one of chat_template, chat_template_file, tokenizer_config"
            )


def _build(cls: Any, data: Any, path: str) -> Any:
    return _coerce(cls, data, path)


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {_show(value)}")
        hints = typing.get_type_hints(tp)
        names = {f.name for f in dataclasses.fields(tp)}
        kwargs = {}
        for key, v in value.items():
            sub = f"{path}.{key}" if path else str(key)
            if key not in names:
                raise ConfigError(sub, f"unknown key; known: {sorted(names)}")
            kwargs[key] = _coerce(hints[key], v, sub)
        return tp(**kwargs)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, path)
            except ConfigError as e:
                errors.append(_detail(e))
        raise ConfigError(path, " or ".join(errors))
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(path, f"expected one of {list(allowed)}, got {_show(value)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(path, f"expected a list, got {_show(value)}")
        (item,) = typing.get_args(tp)
        return [_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {_show(value)}")
        _, item = typing.get_args(tp)
        return {str(k): _coerce(item, v, f"{path}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"expected true or false, got {_show(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"expected an integer, got {_show(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(path, f"expected a number, got {_show(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(path, f"expected a string, got {_show(value)}")
        return value
    raise TypeError(f"unsupported config type {tp!r} at {path}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _detail(e: ConfigError) -> str:
    msg = str(e)
    prefix = f"{e.path}: "
    return msg.split(prefix, 1)[1] if e.path and prefix in msg else msg


def load_yaml(text: str, source: str | None) -> tuple[Any, dict[str, int]]:
    """Parse YAML safely and remember the line of every key path for error messages."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise ConfigError("", f"invalid YAML: {getattr(e, 'problem', e)}", source, line) from None
    lines: dict[str, int] = {}
    if node is not None:
        _walk(node, "", lines)
    return data, lines


def _walk(node: yaml.Node, path: str, lines: dict[str, int]) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            sub = f"{path}.{key.value}" if path else str(key.value)
            lines[sub] = key.start_mark.line + 1
            _walk(value, sub, lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, value in enumerate(node.value):
            _walk(value, f"{path}[{i}]", lines)


def _line_for(lines: dict[str, int], path: str) -> int | None:
    """The line of ``path`` or of its nearest ancestor that the file spells out."""
    while path:
        if path in lines:
            return lines[path]
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return None
