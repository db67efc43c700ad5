"""A read-only MCP server over an OpenRouter account: credits, the key's limits and usage, models, costs.

Agents get it as an MCP Tool so they can answer "what is left on the account?" or "what did that
call cost?" without holding the API key themselves. No tool writes anything.
"""
