"""Minimal JSON schemas for the Prometheus Operator kinds deploy/ uses, which the bundled
Kubernetes schemas do not cover. They hold only the fields deploy/ writes, closed with
``additionalProperties: false`` so that a misspelt field fails instead of being ignored."""

from __future__ import annotations

from typing import Any

DURATION = {"type": "string", "pattern": r"^([0-9]+(ms|s|m|h|d|w|y))+$"}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
    "additionalProperties": False,
}


def _kind(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": METADATA,
            "spec": spec,
        },
        "additionalProperties": False,
    }


SERVICE_MONITOR = _kind(
    "ServiceMonitor",
    {
        "type": "object",
        "required": ["selector", "endpoints"],
        "properties": {
            "selector": {
                "type": "object",
                "properties": {"matchLabels": STRING_MAP},
                "additionalProperties": False,
            },
            "endpoints": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["port"],
                    "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string", "pattern": "^/"},
                        "interval": DURATION,
                        "scrapeTimeout": DURATION,
                    },
                    "additionalProperties": False,
                },
            },
        },
        "additionalProperties": False,
    },
)

PROMETHEUS_RULE = _kind(
    "PrometheusRule",
    {
        "type": "object",
        "required": ["groups"],
        "properties": {
            "groups": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["name", "rules"],
                    "properties": {
                        "name": {"type": "string"},
                        "interval": DURATION,
                        "rules": {
                            "type": "array",
                            "minItems": 1,
                            "items": {
                                "type": "object",
                                "required": ["expr"],
                                "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                "properties": {
                                    "alert": {"type": "string"},
                                    "record": {"type": "string"},
                                    "expr": {"type": "string", "minLength": 1},
                                    "for": DURATION,
                                    "labels": STRING_MAP,
                                    "annotations": STRING_MAP,
                                },
                                "additionalProperties": False,
                            },
                        },
                    },
                    "additionalProperties": False,
                },
            }
        },
        "additionalProperties": False,
    },
)

CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE,
}
