"""Every Secret an Agent's pods would read, and the ones no Agent may name: those rockbot keeps for others.

An Agent's pods get the Secrets its spec names (model key, web search key, `env`) and those of the
Tools it uses (REST auth, MCP headers and environment). rockbot keeps credentials in Secrets of the
same namespaces: each Agent's broker login (`rockbot-<agent>-bus`) and HTTP token
(`rockbot-<agent>-http-token`), and the chart's (broker administrator, service logins; labelled
`app.kubernetes.io/part-of: rockbot`). An Agent naming one of another's would act as that agent on
the bus, or as the operator. So an Agent may name no Secret whose name is another Agent's bus or
token Secret (whether it exists yet or not), nor any existing Secret labelled as part of rockbot that
it does not own; one that does is refused as a whole (`Ready=False`, naming the field), and its
children are left as they were.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rockbot.operator.resolving import wanted_tools
from rockbot.resources import Agent
from rockbot.resources.agent import CHILD_PREFIX

K8sObject = dict[str, Any]
PART_OF = "app.kubernetes.io/part-of"
#: The children of an Agent that hold its credentials (see `builders` and `broker`).
_CREDENTIALS = re.compile(rf"^{re.escape(CHILD_PREFIX)}(?P<agent>.+)-(bus|http-token)$")


def secret_references(agent: Agent, *, tools: list[K8sObject]) -> list[tuple[str, str]]:
    """(field, Secret name) for every Secret the Agent's pods would get, its used Tools' included."""
    spec = agent.spec
    found = [("spec.model.apiKeySecretRef", spec.model.api_key_secret_ref)]
    if spec.web_search is not None:
        found.append(("spec.webSearch.apiKeySecretRef", spec.web_search.api_key_secret_ref))
    long_term = spec.memory.long_term if spec.memory else None
    if long_term is not None and long_term.enabled and long_term.embeddings is not None:
        found.append(("spec.memory.longTerm.embeddings.apiKeySecretRef", long_term.embeddings.api_key_secret_ref))
    found += [
        (f"spec.env[{index}].valueFrom.secretKeyRef", entry.value_from.secret_key_ref)
        for index, entry in enumerate(spec.env)
        if entry.value_from is not None
    ]
    references = [(field, ref.name) for field, ref in found if ref is not None]
    used = set(wanted_tools(agent, tools))
    for body in tools:
        name, tool = body["metadata"]["name"], body.get("spec") or {}
        rest, mcp = tool.get("rest") or {}, tool.get("mcp") or {}
        if name in used and ((rest.get("auth") or {}).get("secretRef") or {}).get("name"):
            references.append((f'Tool "{name}" spec.rest.auth.secretRef', rest["auth"]["secretRef"]["name"]))
        a2a_token = (tool.get("a2a") or {}).get("tokenSecretRef") or {}
        if name in used and a2a_token.get("name"):
            references.append((f'Tool "{name}" spec.a2a.tokenSecretRef', a2a_token["name"]))
        if mcp and (name in used or "mcp" in spec.builtin_tools):
            for kind in ("headersFrom", "envFrom"):
                references += [
                    (f'Tool "{name}" spec.mcp.{kind}[{index}].secretKeyRef', item["secretKeyRef"]["name"])
                    for index, item in enumerate(mcp.get(kind) or [])
                    if (item.get("secretKeyRef") or {}).get("name")
                ]
    return references


def forbidden_references(
    agent: Agent, references: list[tuple[str, str]], *, secrets: Mapping[str, K8sObject]
) -> list[str]:
    """What the Agent may not name, each with its field and the fix; `secrets` holds the named ones that exist."""
    problems = []
    for field, name in references:
        credentials = _CREDENTIALS.match(name)
        secret = secrets.get(name)
        if credentials is not None and credentials["agent"] != agent.metadata["name"]:
            owner = f"Agent {credentials['agent']}'s credentials"
        elif secret is not None and _rockbots(secret) and not _owned_by(secret, agent):
            owner = "credentials rockbot keeps for its own parts"
        else:
            continue
        problems.append(
            f'{field} names Secret "{name}", which holds {owner}: an Agent may use only Secrets of its own, not '
            "those rockbot keeps; point it at another Secret"
        )
    return problems


def _rockbots(secret: K8sObject) -> bool:
    return (secret["metadata"].get("labels") or {}).get(PART_OF) == "rockbot"


def _owned_by(secret: K8sObject, agent: Agent) -> bool:
    return any(ref.get("uid") == agent.metadata.get("uid") for ref in secret["metadata"].get("ownerReferences") or [])
