"""One structured JSON line per request on the ``prefix_proxy.access`` logger."""

from __future__ import annotations

import logging
from typing import Any

import orjson

log = logging.getLogger("prefix_proxy.access")


class AccessLog:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def write(self, **fields: Any) -> None:
        if self.enabled and log.isEnabledFor(logging.INFO):
            for key in ("ttft_s", "duration_s"):
                if fields.get(key) is not None:
                    fields[key] = round(fields[key], 6)
            log.info(orjson.dumps(fields).decode())
