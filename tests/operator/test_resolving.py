"""Tool resolution: what the model is offered, and every way a reference can fail."""

from __future__ import annotations

from rockbot.contracts import agent_config as cfg
from rockbot.operator.resolving import Resolution, agents_using, resolve_agent, secret_env_name
from rockbot.operator.secret_refs import secret_references
from rockbot.resources.common import SecretKeyRef
from tests.operator.samples import ALL_SECRETS, agent, agent_body, tool_body

BUS = SecretKeyRef(name="rockbot-bus", key="amqp-url")
TOKEN = SecretKeyRef(name="rockbot-analyst-http-token", key="token")


def referenced_secrets(the_agent, *, tools) -> set[str]:
    """The Secrets the reconciler reads for this Agent."""
    return {name for _, name in secret_references(the_agent, tools=tools)}


def resolve(the_agent, tools=(), agents=None, secrets=None) -> Resolution:
    return resolve_agent(
        agent=the_agent,
        tools=list(tools),
        agents=agents or {},
        secret_keys=ALL_SECRETS if secrets is None else secrets,
        bus_secret=BUS,
        http_token_secret=TOKEN,
    )


def test_named_and_selected_tools_are_offered_with_builtins_first():
    tools = [tool_body("weather"), tool_body("stocks", labels={"team": "data"}), tool_body("other")]
    result = resolve(
        agent(tools=["weather"], toolSelector={"matchLabels": {"team": "data"}}, builtinTools=["scripts"]), tools
    )
    assert [(t.name, t.source) for t in result.tools] == [
        ("execute_python_script", "builtin:scripts"),
        ("save_result_as_file", "builtin:scripts"),
        ("weather", "tool:weather"),
        ("stocks", "tool:stocks"),
    ]
    assert result.tool_problems == [] and result.blocking_problems == []
    assert [t.definition.function.name for t in result.config.tools] == ["weather", "stocks"]


def test_missing_tool_names_the_culprit_and_the_fix_and_keeps_the_rest():
    result = resolve(agent(tools=["weather", "ghost"]), [tool_body("weather")])
    assert result.tool_problems == [
        'Tool "ghost" not found in namespace default: create it or remove it from spec.tools'
    ]
    assert [t.name for t in result.config.tools] == ["weather"]


def test_tool_that_is_not_accepted_is_left_out_with_the_validator_message():
    bad = tool_body("broken", parameters={"type": "array"})
    result = resolve(agent(tools=["broken"]), [bad])
    assert len(result.tool_problems) == 1
    assert result.tool_problems[0].startswith('Tool "broken" is not accepted: spec.parameters must be an object')
    assert result.config.tools == []


def test_of_two_tools_with_one_function_name_the_first_declared_keeps_it():
    tools = [tool_body("a", functionName="lookup"), tool_body("b", functionName="lookup"), tool_body("c")]
    result = resolve(agent(tools=["b", "a", "c"]), tools)
    assert result.tool_problems == [
        "tool:a and tool:b both offer a tool named 'lookup', so tool:a is not offered (tool:b keeps it: built-in "
        "tools first, then declared ones in the Agent's order, then MCP server listings): give one of them another "
        "name (spec.functionName on its Tool, or subAgents[].toolName)"
    ]
    assert [(t.name, t.source) for t in result.tools][-2:] == [("lookup", "tool:b"), ("c", "tool:c")]
    assert [t.source for t in result.config.tools] == ["tool:b", "tool:c"]


def test_a_builtin_keeps_its_name_against_a_tool_and_a_sub_agent():
    result = resolve(
        agent(tools=["x"], builtinTools=["scripts", "web"], subAgents=[{"name": "helper", "toolName": "web_browse"}]),
        [tool_body("x", functionName="execute_python_script")],
        agents={"helper": agent_body("helper")},
    )
    assert [(t.name, t.source) for t in result.tools] == [
        ("execute_python_script", "builtin:scripts"),
        ("save_result_as_file", "builtin:scripts"),
        ("web_browse", "builtin:web"),
    ]
    assert result.config.tools == []
    assert [problem.split(",")[0] for problem in result.tool_problems] == [
        "tool:x and builtin:scripts both offer a tool named 'execute_python_script'",
        "agent:helper and builtin:web both offer a tool named 'web_browse'",
    ]


def test_missing_rest_auth_secret_is_a_tool_problem_and_never_wired():
    rest = {"url": "https://api.example/{city}", "auth": {"type": "bearer", "secretRef": {"name": "wx", "key": "t"}}}
    tool = tool_body("weather", rest=rest, parameters={"type": "object", "properties": {"city": {"type": "string"}}})
    result = resolve(agent(tools=["weather"]), [tool])
    assert result.tool_problems == [
        'Tool "weather": spec.rest.auth.secretRef: Secret "wx" not found in namespace default: create it with key \'t\''
    ]
    assert all(item.ref.name != "wx" for item in result.secret_env)

    result = resolve(agent(tools=["weather"]), [tool], secrets={**ALL_SECRETS, "wx": {"t"}})
    assert result.tool_problems == []
    auth = result.config.tools[0].backend.auth
    assert auth.value.env == secret_env_name(SecretKeyRef(name="wx", key="t"))
    assert any(item.env == auth.value.env and item.ref.name == "wx" for item in result.secret_env)


def test_missing_model_secret_and_bus_secret_block_readiness():
    result = resolve(agent(), secrets={})
    assert result.blocking_problems == [
        "spec.model.apiKeySecretRef: Secret \"llm\" not found in namespace default: create it with key 'apiKey'",
        "the bus Secret \"rockbot-bus\" (key 'amqp-url') is missing in namespace default: "
        "the operator makes it for the Agent; delete a Secret of that name without the key and it is made anew",
    ]
    # Still wired, so the pod starts by itself once the Secrets exist.
    assert {item.env for item in result.secret_env} >= {"ROCKBOT_MODEL_API_KEY", "ROCKBOT_AMQP_URL"}


def test_sub_agents_become_tools_and_a_missing_or_self_reference_is_reported():
    helper = agent_body("researcher", description="Finds sources.")
    result = resolve(
        agent(subAgents=[{"name": "researcher"}, {"name": "nobody"}, {"name": "analyst"}]),
        agents={"researcher": helper},
    )
    assert [(t.name, t.source, t.description) for t in result.tools if t.source.startswith("agent:")] == [
        ("researcher", "agent:researcher", "Finds sources.")
    ]
    assert result.tool_problems == [
        'sub-agent "nobody" not found in namespace default: create it or remove it',
        'spec.subAgents: "analyst" cannot be its own sub-agent: remove it',
    ]


def test_blacklisted_tools_are_never_offered():
    result = resolve(
        agent(tools=["weather"], builtinTools=["scripts", "memory"], toolBlacklist=["execute_python_script"]),
        [tool_body("weather")],
    )
    assert [t.name for t in result.tools] == ["save_result_as_file", "get_from_working_memory", "weather"]
    assert result.config.tool_blacklist == ["execute_python_script"]


def test_web_search_is_offered_only_when_configured():
    without = resolve(agent(builtinTools=["web"]))
    assert [t.name for t in without.tools] == ["web_browse"]
    with_search = resolve(agent(builtinTools=["web"], webSearch={"provider": "searxng", "url": "http://searx:8080"}))
    assert [t.name for t in with_search.tools] == ["web_browse", "web_search"]


def test_agents_using_a_tool_by_name_or_selector():
    agents = [agent_body("a", tools=["t"]), agent_body("b", toolSelector={"matchLabels": {"x": "1"}}), agent_body("c")]
    tools = [tool_body("t", labels={"x": "1"})]
    assert agents_using("t", tools=tools, agents=agents) == ["a", "b"]


def test_secret_env_names_are_distinct_for_look_alike_secrets():
    first = secret_env_name(SecretKeyRef(name="a-b", key="k"))
    second = secret_env_name(SecretKeyRef(name="a", key="b-k"))
    assert first != second and first.startswith("ROCKBOT_SECRET_")


def test_web_browse_networks_reach_the_config_and_default_to_none():
    assert resolve(agent(builtinTools=["web"])).config.web_browse.allowed_networks == []
    opened = resolve(agent(builtinTools=["web"], webBrowse={"allowedNetworks": ["10.20.0.0/16"]}))
    assert [str(net) for net in opened.config.web_browse.allowed_networks] == ["10.20.0.0/16"]


MCP = {"server": "private", "url": "https://mcp.example/mcp", "tool": "search"}
BEARER = {"name": "Authorization", "prefix": "Bearer ", "secretKeyRef": {"name": "mcp-token", "key": "token"}}


def test_an_mcp_servers_secret_headers_are_wired_as_env_references_never_values():
    tool = tool_body("search", mcp={**MCP, "headersFrom": [BEARER]})
    result = resolve(agent(tools=["search"]), [tool], secrets={**ALL_SECRETS, "mcp-token": {"token"}})
    [resolved] = result.config.tools
    env = secret_env_name(SecretKeyRef(name="mcp-token", key="token"))
    assert resolved.backend.headers["Authorization"].model_dump() == {"env": env, "prefix": "Bearer "}
    assert any(item.env == env and item.ref.name == "mcp-token" for item in result.secret_env)
    assert "mcp-token" in referenced_secrets(agent(tools=["search"]), tools=[tool])

    missing = resolve(agent(tools=["search"]), [tool])
    assert missing.config.tools == [] and missing.tool_problems == [
        'Tool "search": spec.mcp.headersFrom[0].secretKeyRef: Secret "mcp-token" not found in namespace default: '
        "create it with key 'token'"
    ]


def test_of_two_tools_reaching_one_server_name_differently_the_second_is_withheld():
    tools = [tool_body("a", mcp=MCP), tool_body("b", mcp={**MCP, "url": "https://elsewhere.example/mcp",
                                                            "tool": "fetch"})]
    result = resolve(agent(tools=["a", "b"]), tools)
    assert result.tool_problems == [
        "Tool \"b\" names MCP server 'private' with another url, command or credentials than Tool \"a\": give one "
        "of them another spec.mcp.server"
    ]
    assert [t.name for t in result.config.tools] == ["a"]


def test_a_whole_server_tool_shows_as_its_listing_and_claims_no_name():
    result = resolve(agent(tools=["rocks"], builtinTools=[]), [tool_body("rocks", mcp={**MCP, "tool": "*"})])
    assert [(t.name, t.source) for t in result.tools] == [
        ("mcp_list_servers", "builtin:mcp"), ("mcp_get_tool_schema", "builtin:mcp"),
        ("mcp_invoke_tool", "builtin:mcp"), ("private/*", "mcp:private"),
    ]


def test_the_mcp_set_lists_the_namespaces_other_servers_for_attaching():
    tools = [
        tool_body("mine", mcp=MCP),
        tool_body("theirs", mcp={**MCP, "server": "theirs", "headersFrom": [BEARER]}),
        tool_body("broken", mcp={**MCP, "server": "broken"}, parameters={"type": "array"}),
    ]
    secrets = {**ALL_SECRETS, "mcp-token": {"token"}}
    with_set = resolve(agent(tools=["mine"], builtinTools=["mcp"]), tools, secrets=secrets)
    assert [server.server for server in with_set.config.mcp_catalog] == ["theirs"]
    assert "mcp-token" in referenced_secrets(agent(tools=["mine"], builtinTools=["mcp"]), tools=tools)
    assert {t.name for t in with_set.tools} >= {"mcp_register_server", "mcp_unregister_server"}
    without = resolve(agent(tools=["mine"]), tools, secrets=secrets)
    assert without.config.mcp_catalog == [] and "mcp_register_server" not in {t.name for t in without.tools}
    assert "mcp-token" not in referenced_secrets(agent(tools=["mine"]), tools=tools)


def test_a_network_that_does_not_parse_is_named_and_left_out_not_a_failed_reconcile():
    spec = {"allowedNetworks": ["10.0.0.300/8", "10.0.0.1/8", "10.20.0.0/16"], "githubApiUrl": "https://ghe.example/api/v3"}
    result = resolve(agent(builtinTools=["web"], webBrowse=spec))
    assert [str(net) for net in result.config.web_browse.allowed_networks] == ["10.20.0.0/16"]
    assert result.config.web_browse.github_api_url == "https://ghe.example/api/v3"
    assert [problem.split(" (")[0] for problem in result.tool_problems] == [
        "spec.webBrowse.allowedNetworks[0]: '10.0.0.300/8' is not a network",
        "spec.webBrowse.allowedNetworks[1]: '10.0.0.1/8' is not a network",
    ]
    assert result.tool_problems[0].endswith("write an address and prefix length, e.g. 10.20.0.0/16; web_browse is "
                                            "given the others")
    assert "write 10.0.0.0/8" in result.tool_problems[1]


def test_a_daily_token_budget_reaches_the_agents_config():
    assert resolve(agent(limits={"tokensPerDay": 50_000})).config.limits.tokens_per_day == 50_000
    assert resolve(agent()).config.limits.tokens_per_day is None


def test_the_model_request_timeout_is_an_agent_field_with_a_default():
    assert resolve(agent()).config.model.request_timeout_seconds == 60
    body = agent_body("analyst", "default")
    body["spec"]["model"]["requestTimeoutSeconds"] = 300
    from rockbot.resources import Agent

    assert resolve(Agent.model_validate(body)).config.model.request_timeout_seconds == 300


def test_approvals_of_tools_and_of_the_agents_named_tools_reach_the_config():
    tools = [tool_body("deploy", approval={"timeoutSeconds": 120, "onTimeout": "Allow"}),
             tool_body("weather"), tool_body("lenient", approval={"required": False})]
    result = resolve(agent(tools=["deploy", "weather", "lenient"], builtinTools=["scripts"],
                           approval={"tools": ["execute_python_script"], "timeoutSeconds": 30}), tools)
    by_name = {t.name: t.approval for t in result.config.tools}
    assert by_name["deploy"] == cfg.ApprovalPolicy(timeout_seconds=120, on_timeout="Allow")
    assert by_name["weather"] is None and by_name["lenient"] is None
    assert result.config.approvals == {"execute_python_script": cfg.ApprovalPolicy(timeout_seconds=30)}


def test_an_a2a_tool_gets_its_token_as_an_env_reference_and_a_missing_secret_is_named():
    a2a = {"url": "https://geologist.example", "tokenSecretRef": {"name": "geologist", "key": "token"}}
    tool = tool_body("geologist", a2a=a2a)
    result = resolve(agent(tools=["geologist"]), [tool], secrets={**ALL_SECRETS, "geologist": {"token"}})
    [resolved] = result.config.tools
    env = secret_env_name(SecretKeyRef(name="geologist", key="token"))
    assert resolved.backend.model_dump() == {"kind": "a2a", "url": "https://geologist.example", "token": {"env": env}}
    assert resolved.definition.function.parameters["required"] == ["message"]
    assert 'Tool "geologist" spec.a2a.tokenSecretRef' in {f for f, _ in secret_references(
        agent(tools=["geologist"]), tools=[tool])}
    missing = resolve(agent(tools=["geologist"]), [tool])
    assert missing.config.tools == [] and any("spec.a2a.tokenSecretRef" in p for p in missing.tool_problems)


def test_the_run_policy_is_the_agents_own_else_the_chart_default():
    from rockbot.contracts.agent_config import RunPolicy

    default = RunPolicy(record="Metadata", retention_days=7)
    unset = resolve_agent(agent=agent(), tools=[], agents={}, secret_keys=ALL_SECRETS, bus_secret=BUS,
                          http_token_secret=TOKEN, default_runs=default)  # fmt: skip
    own = resolve_agent(agent=agent(runs={"record": "None", "retentionDays": 90}), tools=[], agents={},
                        secret_keys=ALL_SECRETS, bus_secret=BUS, http_token_secret=TOKEN, default_runs=default)
    assert unset.config.runs == default
    assert own.config.runs == RunPolicy(record="None", retention_days=90)
    assert resolve(agent()).config.runs == RunPolicy(record="Full", retention_days=30)


def test_long_term_memory_embeds_with_the_models_endpoint_and_key_by_default():
    memory = {"longTerm": {"enabled": True, "scope": "Agent", "retentionDays": 90, "autoRecall": {"maxItems": 2},
                           "embeddings": {"model": "text-embedding-3-small"}}}
    the_agent = agent(model={"baseUrl": "https://llm.example/v1", "name": "m",
                             "apiKeySecretRef": {"name": "llm", "key": "apiKey"}}, memory=memory)
    result = resolve(the_agent)
    config = result.config.long_term_memory
    assert config is not None and (config.scope, config.retention_days) == ("Agent", 90)
    assert config.embeddings == cfg.EmbeddingsConfig(base_url="https://llm.example/v1", model="text-embedding-3-small",
                                                     api_key=cfg.SecretEnv(env=cfg.MODEL_API_KEY_ENV))
    assert config.auto_recall == cfg.AutoRecallConfig(max_items=2)
    assert [t.name for t in result.tools] == ["get_from_working_memory", "remember", "recall", "forget"]
    assert {t.source for t in result.tools[1:]} == {"builtin:long-term-memory"}


def test_long_term_memory_with_an_endpoint_of_its_own_gets_only_its_own_key():
    memory = {"longTerm": {"enabled": True, "embeddings": {"model": "e", "baseUrl": "http://embed.example/v1"}}}
    result = resolve(agent(memory=memory))
    assert result.config.long_term_memory.embeddings.api_key is None
    memory["longTerm"]["embeddings"]["apiKeySecretRef"] = {"name": "embed", "key": "token"}
    missing = resolve(agent(memory=memory))
    assert missing.config.long_term_memory is None
    assert missing.tool_problems == ['spec.memory.longTerm.embeddings.apiKeySecretRef: Secret "embed" not found in '
                                     "namespace default: create it with key 'token'"]
    assert "embed" in referenced_secrets(agent(memory=memory), tools=[])
    found = resolve(agent(memory=memory), secrets={**ALL_SECRETS, "embed": {"token"}})
    assert found.config.long_term_memory.embeddings.api_key == cfg.SecretEnv(env=cfg.EMBEDDINGS_API_KEY_ENV)
    assert cfg.EMBEDDINGS_API_KEY_ENV in {item.env for item in found.secret_env}


def test_disabled_long_term_memory_offers_nothing():
    result = resolve(agent(memory={"longTerm": {"enabled": False, "embeddings": {"model": "e"}}}))
    assert result.config.long_term_memory is None and "remember" not in [t.name for t in result.tools]
