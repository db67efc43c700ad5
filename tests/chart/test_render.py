"""The chart renders valid Kubernetes objects for every supported way of installing it."""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from rockbot.bus.topology import MAX_MESSAGE_BYTES
from rockbot.operator.settings import AGENT_FORBIDDEN, OperatorSettings
from rockbot.scripts_manager.settings import DEFAULT_TARGETS, ScriptsManagerSettings
from tests.chart.combinations import COMBINATIONS
from tests.chart.conftest import CHART, NAMESPACE, Helm, Manifest

# The oldest Kubernetes the chart supports (Chart.yaml's kubeVersion lower bound, e.g. ">=1.27.0-0" ->
# "1.27"): every manifest is validated against that release's OpenAPI schemas, and against the newest
# release kubernetes-validate knows, so nothing the chart uses is too new or already removed.
KUBE_VERSION_CONSTRAINT = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
OLDEST_KUBERNETES = ".".join(re.fullmatch(r">=\s*v?(\d+)\.(\d+)(?:\.\d+)?(?:-0)?", KUBE_VERSION_CONSTRAINT).groups())
KUBERNETES_VERSIONS = [OLDEST_KUBERNETES, kubernetes_validate.latest_version()]

Render = Callable[..., list[Manifest]]
#: API groups of other operators' custom resources the chart may render.
OPERATOR_KINDS = ("monitoring.coreos.com/",)


def find(manifests: list[Manifest], kind: str, name: str | None = None, namespace: str | None = None) -> Manifest:
    found = [m for m in manifests if m["kind"] == kind
             and (name is None or m["metadata"]["name"] == name)
             and (namespace is None or m["metadata"].get("namespace") == namespace)]
    assert len(found) == 1, f"expected one {kind} {name or ''} in {namespace or 'any namespace'}, found {len(found)}"
    return found[0]


def env_of(deployment: Manifest) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def secret_text(secret: Manifest, key: str) -> str:
    return base64.b64decode(secret["data"][key]).decode()


@pytest.mark.parametrize("name", COMBINATIONS)
def test_helm_lint_passes(helm: Helm, tmp_path, name: str) -> None:
    values = tmp_path / "values.json"
    values.write_text(json.dumps(COMBINATIONS[name]))
    out = helm.run("lint", "--strict", str(CHART), "--namespace", NAMESPACE, "--values", str(values))
    assert "0 chart(s) failed" in out


def test_the_oldest_supported_kubernetes_is_one_the_schemas_exist_for() -> None:
    assert OLDEST_KUBERNETES == "1.27"
    known = {kubernetes_validate.utils.major_minor(version) for version in kubernetes_validate.utils.all_versions()}
    assert OLDEST_KUBERNETES in known


@pytest.fixture(scope="module")
def schemas_read_once() -> Iterator[None]:
    """kubernetes-validate reads a kind's schema and all of a release's definitions (megabytes of JSON) from disk at
    every call: read each file once for the module (the same schemas judge every manifest, ten times cheaper)."""
    with pytest.MonkeyPatch.context() as patch:
        utils = kubernetes_validate.utils
        patch.setattr(utils, "schema_contents", functools.cache(utils.schema_contents))
        yield


@pytest.mark.usefixtures("schemas_read_once")
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", COMBINATIONS)
def test_every_manifest_matches_the_kubernetes_openapi_schema(render: Render, name: str, version: str) -> None:
    manifests = render(COMBINATIONS[name])
    assert manifests
    for manifest in manifests:
        if manifest["apiVersion"].startswith(OPERATOR_KINDS):
            continue  # the Prometheus Operator's kinds: no OpenAPI schema in Kubernetes (test_monitoring checks them)
        where = f"{manifest['kind']}/{manifest['metadata']['name']}"
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{where} at {'.'.join(map(str, error.path))} (Kubernetes {version}): {error.message}")


@pytest.mark.parametrize("name", COMBINATIONS)
def test_every_object_carries_the_standard_labels(render: Render, name: str) -> None:
    for manifest in render(COMBINATIONS[name]):
        if manifest["kind"] == "CustomResourceDefinition":
            continue  # shipped verbatim from crds/, not templated
        labels = manifest["metadata"].get("labels", {})
        for key in ("helm.sh/chart", "app.kubernetes.io/name", "app.kubernetes.io/instance",
                    "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "app.kubernetes.io/component"):
            assert key in labels, f"{manifest['kind']}/{manifest['metadata']['name']} lacks label {key}"


def test_image_tag_defaults_to_the_chart_app_version(render: Render) -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    manifests = render()
    operator = find(manifests, "Deployment", "rockbot-operator")
    image = operator["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ghcr.io/rockbot-dev/rockbot:{app_version}"
    assert env_of(operator)["ROCKBOT_AGENT_IMAGE"] == image


def test_the_script_image_is_the_charts_data_image_of_the_same_tag_unless_set(render: Render) -> None:
    def script_image(values: dict[str, object]) -> str:
        return env_of(find(render(values), "Deployment", "rockbot-scripts-manager"))["ROCKBOT_SCRIPTS_IMAGE"]

    assert script_image({"image": {"repository": "reg.local/rb", "tag": "e2e-1"}}) == "reg.local/rb-scripts:e2e-1"
    assert script_image({"scripts": {"image": "python:3.12-slim"}}) == "python:3.12-slim"


def test_image_digest_pins_every_rockbot_container(render: Render) -> None:
    digest = "sha256:" + "b" * 64
    manifests = render({"image": {"digest": digest, "tag": "ignored"}, "openrouterMcp": {"enabled": True}})
    deployments = [m for m in manifests if m["kind"] == "Deployment"]
    assert len(deployments) == 5  # operator, scripts-manager, gateway, console, openrouter-mcp
    for deployment in deployments:
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"] == f"ghcr.io/rockbot-dev/rockbot@{digest}"


def test_each_service_gets_a_broker_login_of_its_own_and_only_the_operator_the_administrators(
    render: Render,
) -> None:
    manifests = render()
    admin = find(manifests, "Secret", "rockbot-rabbitmq")
    assert admin["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(secret_text(admin, "password")) == 32
    passwords = set()
    for service in ("operator", "scripts-manager", "gateway"):
        login = find(manifests, "Secret", f"rockbot-{service}-bus", NAMESPACE)
        url = urlsplit(secret_text(login, "amqp-url"))
        # A fully qualified host, so every namespace reaches it; the service's own user and password.
        host = f"rockbot-rabbitmq.{NAMESPACE}.svc"
        assert (url.scheme, url.hostname, url.port, url.path) == ("amqp", host, 5672, "/")
        assert (url.username, url.password) == (f"service.{service}", secret_text(login, "password"))
        passwords.add(url.password)
    assert len(passwords) == 3 and secret_text(admin, "password") not in passwords
    operator = env_of(find(manifests, "Deployment", "rockbot-operator"))
    admin_password = {"secretKeyRef": {"name": "rockbot-rabbitmq", "key": "password"}}
    assert operator["ROCKBOT_BROKER_ADMIN_PASSWORD"] == admin_password
    for name in ("rockbot-scripts-manager", "rockbot-gateway", "rockbot-openrouter-mcp"):
        for deployment in [m for m in manifests if m["kind"] == "Deployment" and m["metadata"]["name"] == name]:
            assert "rockbot-rabbitmq" not in json.dumps(deployment), f"{name} must not see the administrator's login"


def test_rabbitmq_password_from_values_reaches_only_the_administrators_secret(render: Render) -> None:
    manifests = render({"rabbitmq": {"auth": {"username": "bot", "password": "p@ss/w:rd"}}})
    assert secret_text(find(manifests, "Secret", "rockbot-rabbitmq"), "password") == "p@ss/w:rd"
    assert "p@ss/w:rd" not in secret_text(find(manifests, "Secret", "rockbot-operator-bus"), "amqp-url")


def test_rabbitmq_runs_the_official_image_with_a_volume_and_loopback_users_off(render: Render) -> None:
    manifests = render()
    statefulset = find(manifests, "StatefulSet", "rockbot-rabbitmq")
    pod = statefulset["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"].startswith("docker.io/library/rabbitmq:4.1.")  # checks CC/BCC (issue 18)
    assert statefulset["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]} >= {"/var/lib/rabbitmq"}
    config = find(manifests, "ConfigMap", "rockbot-rabbitmq")["data"]["10-rockbot.conf"]
    assert "loopback_users = none" in config.splitlines()
    assert f"max_message_size = {MAX_MESSAGE_BYTES}" in config.splitlines()  # what the bus itself refuses over


def test_external_broker_url_replaces_the_bundled_rabbitmq(render: Render) -> None:
    manifests = render(COMBINATIONS["external-broker"])
    assert [m["metadata"]["name"] for m in manifests if m["kind"] == "StatefulSet"] == ["rockbot-runstore"]
    assert not [m for m in manifests if "rabbitmq" in m["metadata"]["name"]]
    admin = find(manifests, "Secret", "rockbot-broker-admin")
    assert (secret_text(admin, "username"), secret_text(admin, "password")) == ("rockbot", "s3cret")
    url = urlsplit(secret_text(find(manifests, "Secret", "rockbot-operator-bus"), "amqp-url"))
    assert (url.scheme, url.username, url.hostname, url.port, url.path) == (
        "amqps", "service.operator", "broker.example", 5671, "/rockbot")
    operator = env_of(find(manifests, "Deployment", "rockbot-operator"))
    assert operator["ROCKBOT_BROKER_AGENT_URL"] == "amqps://broker.example:5671/rockbot"
    assert operator["ROCKBOT_BROKER_MANAGEMENT_URL"] == "http://broker.example:15672/"
    egress = find(manifests, "NetworkPolicy", "rockbot-agent-egress")["spec"]["egress"]
    assert {"to": [{"ipBlock": {"cidr": "203.0.113.10/32"}}], "ports": [{"protocol": "TCP", "port": 5671}]} in egress


def test_the_console_records_runs_in_the_bundled_postgresql_or_an_external_one(render: Render) -> None:
    manifests = render()
    console = env_of(find(manifests, "Deployment", "rockbot-console"))
    assert console["ROCKBOT_DATABASE_URL"] == {"secretKeyRef": {"name": "rockbot-runstore", "key": "url"}}
    assert console["ROCKBOT_AMQP_URL"] == {"secretKeyRef": {"name": "rockbot-console-bus", "key": "amqp-url"}}
    database = find(manifests, "StatefulSet", "rockbot-runstore")["spec"]
    assert database["template"]["spec"]["containers"][0]["image"] == "docker.io/pgvector/pgvector:0.8.6-pg15-bookworm"
    assert database["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "8Gi"
    url = urlsplit(secret_text(find(manifests, "Secret", "rockbot-runstore"), "url"))
    assert (url.scheme, url.username, url.hostname) == ("postgresql", "rockbot", f"rockbot-runstore.{NAMESPACE}.svc")
    ingress = find(manifests, "NetworkPolicy", "rockbot-runstore")["spec"]["ingress"]
    assert ingress[0]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "console"

    external = render({"runStore": {"postgres": {"enabled": False}, "externalDatabase": {"existingSecret": "my-db"}}})
    assert not [m for m in external if "runstore" in m["metadata"]["name"]]
    assert env_of(find(external, "Deployment", "rockbot-console"))["ROCKBOT_DATABASE_URL"] == {
        "secretKeyRef": {"name": "my-db", "key": "url"}}


def test_an_existing_administrator_secret_is_referenced_and_not_created(render: Render) -> None:
    manifests = render(COMBINATIONS["existing-admin-secret"])
    assert sorted(m["metadata"]["name"] for m in manifests if m["kind"] == "Secret") == [
        "rockbot-console-bus", "rockbot-gateway-bus", "rockbot-operator-bus", "rockbot-runstore",
        "rockbot-scripts-manager-bus"]
    operator_env = env_of(find(manifests, "Deployment", "rockbot-operator"))
    assert operator_env["ROCKBOT_BROKER_ADMIN_USERNAME"] == {"secretKeyRef": {"name": "my-admin", "key": "username"}}
    assert operator_env["ROCKBOT_BROKER_MANAGEMENT_URL"] == "https://broker.example/api/"


def test_operator_env_follows_the_settings_contract(render: Render) -> None:
    env = env_of(find(render(), "Deployment", "rockbot-operator"))
    assert env == {
        "ROCKBOT_NAMESPACES": NAMESPACE,
        "ROCKBOT_LEADER_LEASE": "rockbot-operator",
        "ROCKBOT_LEADER_LEASE_NAMESPACE": NAMESPACE,
        "ROCKBOT_AGENT_IMAGE": env["ROCKBOT_AGENT_IMAGE"],
        "ROCKBOT_AMQP_URL": {"secretKeyRef": {"name": "rockbot-operator-bus", "key": "amqp-url"}},
        "ROCKBOT_SCRIPTS_MANAGER_AMQP_URL": {
            "secretKeyRef": {"name": "rockbot-scripts-manager-bus", "key": "amqp-url"}},
        "ROCKBOT_GATEWAY_AMQP_URL": {"secretKeyRef": {"name": "rockbot-gateway-bus", "key": "amqp-url"}},
        "ROCKBOT_CONSOLE_AMQP_URL": {"secretKeyRef": {"name": "rockbot-console-bus", "key": "amqp-url"}},
        "ROCKBOT_BROKER_MANAGEMENT_URL": f"http://rockbot-rabbitmq.{NAMESPACE}.svc:15672/",
        "ROCKBOT_BROKER_ADMIN_USERNAME": {"secretKeyRef": {"name": "rockbot-rabbitmq", "key": "username"}},
        "ROCKBOT_BROKER_ADMIN_PASSWORD": {"secretKeyRef": {"name": "rockbot-rabbitmq", "key": "password"}},
        "ROCKBOT_BROKER_AGENT_URL": f"amqp://rockbot-rabbitmq.{NAMESPACE}.svc:5672/",
        "ROCKBOT_RUNS_RECORD": "Full",
        "ROCKBOT_RUNS_RETENTION_DAYS": "30",
        "ROCKBOT_SCRIPTS_NAMESPACE": "rockbot-scripts",
        "ROCKBOT_LOG_FORMAT": "json",
        "ROCKBOT_EGRESS_CANARY": "true",
        "ROCKBOT_EGRESS_CANARY_INTERVAL_SECONDS": "600",
        "ROCKBOT_EGRESS_CANARY_TARGETS": env["ROCKBOT_EGRESS_CANARY_TARGETS"],
    }
    assert OperatorSettings(egress_canary_targets=env["ROCKBOT_EGRESS_CANARY_TARGETS"]).egress_canary_targets == \
        AGENT_FORBIDDEN


def test_the_egress_canary_is_opt_out_and_takes_its_pod_rights_with_it(render: Render) -> None:
    def operator_rules(manifests: list[Manifest]) -> list[dict]:
        return find(manifests, "Role", "rockbot-operator")["rules"]

    on = render()
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "watch", "delete"]} in operator_rules(on)
    assert {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["list"]} in \
        operator_rules(on)
    off = render({"agents": {"egressCanary": {"enabled": False}}})
    assert not [rule for rule in operator_rules(off) if {"pods", "networkpolicies"} & set(rule["resources"])]
    assert not [name for name in env_of(find(off, "Deployment", "rockbot-operator")) if "CANARY" in name]


def test_operator_watches_all_namespaces_only_when_asked(render: Render) -> None:
    env = env_of(find(render({"agentNamespaces": ["team-a"]}), "Deployment", "rockbot-operator"))
    assert env["ROCKBOT_NAMESPACES"] == f"{NAMESPACE},team-a"
    env = env_of(find(render(COMBINATIONS["everything"]), "Deployment", "rockbot-operator"))
    assert env["ROCKBOT_NAMESPACES"] == ""
    assert env["ROCKBOT_EXTRA"] == "1"


def test_agent_namespaces_each_get_the_egress_policy_and_no_bus_secret(render: Render) -> None:
    manifests = render(COMBINATIONS["agent-namespaces"])
    for namespace in (NAMESPACE, "team-a", "team-b"):
        find(manifests, "NetworkPolicy", "rockbot-agent-egress", namespace)
    # Agents share no login: the operator makes each its own (issue 13 §5).
    assert {m["metadata"]["namespace"] for m in manifests if m["kind"] == "Secret"} == {NAMESPACE}


def test_agent_egress_allows_only_dns_the_bus_and_the_llm(render: Render) -> None:
    policy = find(render(COMBINATIONS["agent-namespaces"]), "NetworkPolicy", "rockbot-agent-egress", "team-a")
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "rockbot-agent"}}
    assert spec["policyTypes"] == ["Egress"]
    dns, bus, llm = spec["egress"]
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert {p["port"] for p in dns["ports"]} == {53}
    assert bus["to"][0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
    assert bus["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "rabbitmq"
    assert bus["ports"] == [{"protocol": "TCP", "port": 5672}]
    assert llm == {"to": [{"ipBlock": {"cidr": "198.51.100.0/24"}}],
                   "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 8443}]}


def test_scripts_namespace_enforces_restricted_and_denies_all_traffic(render: Render) -> None:
    manifests = render()
    labels = find(manifests, "Namespace", "rockbot-scripts")["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"
    policies = [
        m for m in manifests if m["kind"] == "NetworkPolicy" and m["metadata"]["namespace"] == "rockbot-scripts"
    ]
    assert len(policies) == 1, "nothing may open traffic in the scripts namespace"
    (deny,) = policies
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}


def test_sandbox_options_reach_the_scripts_manager_and_open_no_traffic(render: Render) -> None:
    manifests = render(COMBINATIONS["sandbox-options"])
    env = env_of(find(manifests, "Deployment", "rockbot-scripts-manager"))
    assert env["ROCKBOT_SCRIPTS_RUNTIME_CLASS"] == "gvisor"
    assert env["ROCKBOT_SCRIPTS_PRIORITY_CLASS"] == "rockbot-scripts"
    assert env["ROCKBOT_SCRIPTS_ALLOWED_PACKAGES"] == "numpy,pandas"
    assert env["ROCKBOT_SCRIPTS_POOL"] == "500m/256Mi=2"  # a class of size 0 keeps nothing
    scripts_policies = [m for m in manifests if m["kind"] == "NetworkPolicy"
                        and m["metadata"]["namespace"] == "rockbot-scripts"]
    assert [p["spec"] for p in scripts_policies] == [{"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}]


def test_scripts_manager_env_follows_the_settings_contract(render: Render) -> None:
    deployment = find(render(), "Deployment", "rockbot-scripts-manager")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["scripts-manager", "--log-format", "json"]
    env = env_of(deployment)
    # The chart's canary targets are the settings' defaults; `broker` comes from the AMQP URL.
    assert json.loads(env.pop("ROCKBOT_SCRIPTS_ISOLATION_TARGETS")) == DEFAULT_TARGETS
    assert env == {
        "ROCKBOT_AMQP_URL": {"secretKeyRef": {"name": "rockbot-scripts-manager-bus", "key": "amqp-url"}},
        "ROCKBOT_SCRIPTS_NAMESPACE": "rockbot-scripts",
        "ROCKBOT_POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}},  # names its Lease
        "ROCKBOT_SCRIPTS_BACKEND": "pods",
        "ROCKBOT_SCRIPTS_AGENT_LIMITS": "agents",  # each agent's scripts get its own Agent's scriptLimits
        "ROCKBOT_NAMESPACES": "rockbot",  # the Agents it follows are those the operator watches
        "ROCKBOT_SCRIPTS_CONCURRENCY": "4",
        "ROCKBOT_SCRIPTS_IMAGE": "ghcr.io/rockbot-dev/rockbot-scripts:0.1.0",  # Dockerfile.scripts, the chart's version
        "ROCKBOT_SCRIPTS_ISOLATION_ENFORCE": "true",
        "ROCKBOT_SCRIPTS_ISOLATION_INTERVAL_SECONDS": "600",
        "ROCKBOT_SCRIPTS_ISOLATION_DEBOUNCE_SECONDS": "5",
    }


def test_isolation_canary_targets_each_configurable_and_off_when_empty(render: Render) -> None:
    values = {"scripts": {"isolation": {"enforce": False, "targets": {
        "outside": [], "broker": ["tcp://rabbit.example:5672"], "metadata": ["tcp://10.245.0.1:18080"]}}}}
    env = env_of(find(render(values), "Deployment", "rockbot-scripts-manager"))
    assert env["ROCKBOT_SCRIPTS_ISOLATION_ENFORCE"] == "false"
    settings = ScriptsManagerSettings(scripts_isolation_targets=json.loads(env["ROCKBOT_SCRIPTS_ISOLATION_TARGETS"]))
    assert settings.isolation_targets == {**DEFAULT_TARGETS, "outside": [], "broker": ["tcp://rabbit.example:5672"],
                                          "metadata": ["tcp://10.245.0.1:18080"]}


def test_openrouter_mcp_reads_its_key_from_a_secret_and_serves_agents_only(render: Render) -> None:
    manifests = render(COMBINATIONS["openrouter-mcp"])
    deployment = find(manifests, "Deployment", "rockbot-openrouter-mcp")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == "openrouter-mcp"
    assert env_of(deployment)["OPENROUTER_API_KEY"] == {"secretKeyRef": {"name": "openrouter", "key": "api-key"}}
    find(manifests, "Service", "rockbot-openrouter-mcp")
    ingress = find(manifests, "NetworkPolicy", "rockbot-openrouter-mcp")["spec"]["ingress"]
    assert ingress[0]["from"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "rockbot-agent"}}
    agents_egress = find(manifests, "NetworkPolicy", "rockbot-agent-egress")["spec"]["egress"]
    assert any(rule["ports"] == [{"protocol": "TCP", "port": 8080}] for rule in agents_egress)
    assert not [m for m in render() if "openrouter" in m["metadata"]["name"]]
    assert "OPENROUTER_MANAGEMENT_KEY" not in env_of(deployment)


def test_openrouter_mcp_gets_a_management_key_only_from_a_secret_named_for_it(render: Render) -> None:
    values = {"openrouterMcp": {"enabled": True, "managementKeySecret": {"name": "or-admin", "key": "mk"}}}
    deployment = find(render(values), "Deployment", "rockbot-openrouter-mcp")
    assert env_of(deployment)["OPENROUTER_MANAGEMENT_KEY"] == {"secretKeyRef": {"name": "or-admin", "key": "mk"}}


def test_gateway_env_follows_the_settings_contract(render: Render) -> None:
    from rockbot.gateway.settings import GatewaySettings

    manifests = render()
    deployment = find(manifests, "Deployment", "rockbot-gateway")
    env = env_of(deployment)
    assert env == {
        "ROCKBOT_AMQP_URL": {"secretKeyRef": {"name": "rockbot-gateway-bus", "key": "amqp-url"}},
        "ROCKBOT_NAMESPACES": NAMESPACE,
        "ROCKBOT_PUBLIC_URL": f"http://rockbot-gateway.{NAMESPACE}.svc:80",
        "ROCKBOT_CROSS_NAMESPACE_EVENTS": "false",
        "ROCKBOT_LOG_FORMAT": "json",
    }
    fields = {f"ROCKBOT_{field.upper()}" for field in GatewaySettings.model_fields}
    assert set(env) <= fields, "every variable the chart sets is a gateway setting"
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["gateway"]
    assert {port["containerPort"] for port in container["ports"]} == {8443, 8080}  # the settings' defaults
    service = find(manifests, "Service", "rockbot-gateway")
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "webhooks"}]
    assert [m for m in manifests if m["kind"] == "Ingress"] == []


def test_an_exposed_gateway_serves_tls_behind_its_ingress_and_takes_webhooks_from_it_only(render: Render) -> None:
    manifests = render(COMBINATIONS["gateway-exposed"])
    deployment = find(manifests, "Deployment", "rockbot-gateway")
    env = env_of(deployment)
    assert env["ROCKBOT_PUBLIC_URL"] == "https://hooks.example.com"
    assert env["ROCKBOT_CROSS_NAMESPACE_EVENTS"] == "true"
    assert (env["ROCKBOT_TLS_CERT_FILE"], env["ROCKBOT_TLS_KEY_FILE"]) == ("/etc/rockbot/tls/tls.crt",
                                                                            "/etc/rockbot/tls/tls.key")
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "gateway-tls"}} in volumes
    assert deployment["spec"]["replicas"] == 2
    ingress = find(manifests, "Ingress", "rockbot-gateway")
    assert ingress["spec"]["tls"] == [{"hosts": ["hooks.example.com"], "secretName": "hooks-tls"}]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "hooks.example.com"
    assert rule["http"]["paths"] == [{"path": "/hooks/", "pathType": "Prefix", "backend": {
        "service": {"name": "rockbot-gateway", "port": {"number": 80}}}}]
    policy = find(manifests, "NetworkPolicy", "rockbot-gateway")["spec"]
    webhooks, metrics = policy["ingress"]
    assert webhooks["ports"] == [{"protocol": "TCP", "port": 8443}]
    ingress_controller = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
    assert webhooks["from"] == [ingress_controller]
    assert metrics["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}],
            "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]} in policy["egress"]


def test_without_the_gateway_nothing_of_it_is_rendered(render: Render) -> None:
    manifests = render(COMBINATIONS["gateway-off"])
    assert not [m for m in manifests if "gateway" in m["metadata"]["name"]]
    assert "ROCKBOT_GATEWAY_AMQP_URL" not in env_of(find(manifests, "Deployment", "rockbot-operator"))
