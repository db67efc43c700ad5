"""Tests of the read-only OpenRouter MCP server."""
