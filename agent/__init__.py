"""The agent runtime: an LLM tool-calling loop that talks to the rest over the bus."""
