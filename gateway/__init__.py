"""The gateway: Triggers (webhooks and Kubernetes events) start agent runs, exactly once per delivery.

It is a process of its own, apart from the operator (which holds the broker's admin login and wide
rights): an internet-facing endpoint with only the rights it needs (watch Triggers, Agents and
Events, read the Secrets holding webhook keys, patch `triggers/status`), and the bus principal
`service.gateway`, which may put runs on agents' inboxes and reads their answers on `gateway.runs`.

A delivery goes through the same steps whatever its source: matched to its Trigger and checked
(`webhooks`: size, media type, HMAC signature; `events`: selector, freshness), decided on the
Trigger's status (`admission`: seen before, rate limit, concurrency policy, de-duplication), and
recorded with a conditional write of that status (`ledger`) before its prompt, rendered from the
Trigger's template (`templates`), goes to the agent's inbox (`dispatch`). The agent's answer comes
back on `gateway.runs` and completes the run in the history.
"""
