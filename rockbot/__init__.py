"""rockbot: Kubernetes-native AI agents whose Python runs in throw-away, network-less sandboxes.

The `rockbot` package is the shared core (contracts, bus, configuration, the CLI); the three
processes import it as `rockbot.operator`, `rockbot.agent` and `rockbot.scripts_manager`.
"""

__version__ = "0.1.0"
