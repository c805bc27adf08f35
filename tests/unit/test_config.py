import pytest

from proxy.cli import main
from proxy.config import ConfigError, load_config, parse_config


def test_defaults_are_valid():
    loaded = parse_config("")
    assert loaded.policy.name == "default"
    assert loaded.config.listen.port == 8000
    assert loaded.config.upstream.max_attempts == 3


def test_overrides_apply_on_top_of_the_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("listen:\n  port: 9000\npolicy: least-load\n")
    loaded = load_config(f, {"listen.host": "0.0.0.0", "backends.static": ["http://127.0.0.1:1"]})
    assert loaded.config.listen.port == 9000
    assert loaded.config.listen.host == "0.0.0.0"
    assert loaded.config.backends.static == ["http://127.0.0.1:1"]
    assert loaded.policy.name == "least-load"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("listen:\n  port: x\n", "c.yaml:2: listen.port: expected an integer, got 'x'"),
        ("upstream:\n  max_attempts: 0\n", "c.yaml:2: upstream.max_attempts: must be > 0"),
        ("listen:\n  prot: 1\n", "c.yaml:2: listen.prot: unknown key"),
        (
            "backends:\n  static: [ftp://x]\n",
            "c.yaml:2: backends.static[0]: must be an http(s) URL",
        ),
        (
            "policy:\n  scorers:\n    prefix:\n      weight: big\n",
            "c.yaml:4: policy.scorers.prefix.weight: must be a number",
        ),
        ("policy: nosuchpreset\n", "c.yaml:1: policy: no preset or file named 'nosuchpreset'"),
        ("upstream:\n  authorization: replace\n", "upstream.token: required"),
        ("telemetry:\n  tracing:\n    exporter: zipkin\n", "c.yaml:3: telemetry.tracing.exporter"),
        ("listen: [1, 2\n", "invalid YAML"),
        ("- just\n- a list\n", "must be a YAML mapping"),
    ],
)
def test_errors_name_key_path_and_line(text, expected):
    with pytest.raises(ConfigError) as e:
        parse_config(text, source="c.yaml")
    assert expected in str(e.value)


def test_policy_file_errors_point_into_the_policy_file(tmp_path):
    pol = tmp_path / "mine.yaml"
    pol.write_text("name: mine\nscorers:\n  prefix:\n    weight: 1\n  queue:\n    scael: 3\n")
    with pytest.raises(ConfigError) as e:
        parse_config(f"policy: {pol}\n", source="c.yaml")
    assert f"{pol}:6: scorers.queue.scael: unknown parameter" in str(e.value)


def test_check_config_command(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text("policy: agent-fleet\nbackends:\n  static: [http://127.0.0.1:9]\n")
    assert main(["check-config", str(good)]) == 0
    assert "agent-fleet" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("scorers:\n  prefix:\n    weight: -2\n")
    assert main(["check-config", str(bad)]) == 2
    assert "bad.yaml:3: scorers.prefix.weight: must be >= 0" in capsys.readouterr().err
    assert main(["check-config", str(tmp_path / "missing.yaml")]) == 2


def test_every_shipped_preset_passes_check_config(capsys):
    from pathlib import Path

    for f in sorted((Path(__file__).resolve().parents[2] / "policies").glob("*.yaml")):
        assert main(["check-config", str(f)]) == 0, capsys.readouterr().err
