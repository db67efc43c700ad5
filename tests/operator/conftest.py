"""The chart's fixtures (a real helm, `render(values)`), for tests that start the operator as the chart deploys it."""

from tests.chart.conftest import helm, render
from tests.pod_process import late_rabbitmq, pods

__all__ = ["helm", "late_rabbitmq", "pods", "render"]
