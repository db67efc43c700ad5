"""Data that crosses process boundaries: every message and rendered config is a versioned pydantic model."""
