"""Fixtures that start real parts: each lives in its own plugin module under tests/fixtures/."""

pytest_plugins = [
    "tests.fixtures.kube_real",
    "tests.fixtures.kubeapi",
    "tests.fixtures.rabbitmq",
    "tests.fixtures.llm",
    "tests.fixtures.tracing",
    "tests.fixtures.postgres",
]
