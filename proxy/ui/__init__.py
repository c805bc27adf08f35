"""The operator's live status page (/ui) and the JSON it polls (/ui/state)."""

from proxy.ui.routes import ui_routes

__all__ = ["ui_routes"]
