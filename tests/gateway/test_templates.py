"""Prompt templates in Jinja2's sandbox: compile errors name the field, renders are bounded in size and time."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from rockbot.gateway import templates
from rockbot.gateway.signatures import verify
from rockbot.gateway.templates import Prompt, RenderError, TemplateProblem
from rockbot.resources.trigger import WebhookSignature

ISSUE = {"action": "opened", "issue": {"title": "Login fails"}}


async def test_a_prompt_renders_the_payload_and_when_filters_deliveries() -> None:
    prompt = Prompt.compile(prompt="New issue: {{ payload.issue.title }} by {{ payload.sender.login | default('?') }}",
                            when="payload.action == 'opened'")  # fmt: skip
    assert await prompt.render({"payload": ISSUE}) == "New issue: Login fails by ?"
    assert await prompt.applies({"payload": ISSUE})
    assert not await prompt.applies({"payload": {**ISSUE, "action": "closed"}})


def test_a_template_that_does_not_compile_is_named_with_its_field_and_line() -> None:
    with pytest.raises(TemplateProblem, match=r"^spec.prompt: line 2: "):
        Prompt.compile(prompt="fine\n{% for x in %}", when=None)
    with pytest.raises(TemplateProblem, match=r"^spec.when: "):
        Prompt.compile(prompt="fine", when="payload.action ==")


async def test_a_render_is_sandboxed_and_bounded_in_size_and_time(monkeypatch: pytest.MonkeyPatch) -> None:
    escape = Prompt.compile(prompt="{{ ''.__class__.__mro__[1].__subclasses__() }}", when=None)
    with pytest.raises(RenderError, match=r"^spec\.prompt"):
        await escape.render({})
    flood = Prompt.compile(prompt="{% for i in range(100000) %}{{ payload }}{% endfor %}", when=None)
    with pytest.raises(RenderError, match="more than 262144 characters"):
        await flood.render({"payload": "x" * 100})
    monkeypatch.setattr(templates, "RENDER_SECONDS", 0.2)
    spin = Prompt.compile(prompt="{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                          when=None)  # fmt: skip
    with pytest.raises(RenderError, match=r"took longer than 0\.2 s"):
        await spin.render({})
    with pytest.raises(RenderError, match="ZeroDivisionError"):
        await Prompt.compile(prompt="{{ 1 / 0 }}", when=None).render({})


def test_signatures_in_githubs_form_and_a_generic_header_form() -> None:
    key, body = b"k3y", b'{"action":"opened"}'
    digest = hmac.new(key, body, hashlib.sha256).digest()
    github = WebhookSignature()
    assert verify(key=key, body=body, header_value="sha256=" + digest.hex(), signature=github)
    assert not verify(key=key, body=body + b" ", header_value="sha256=" + digest.hex(), signature=github)
    assert not verify(key=key, body=body, header_value=digest.hex(), signature=github)  # no prefix
    assert not verify(key=key, body=body, header_value="sha256=zz", signature=github)
    assert not verify(key=key, body=body, header_value=None, signature=github)
    generic = WebhookSignature(header="X-Signature", prefix="", encoding="base64")
    assert verify(key=key, body=body, header_value=base64.b64encode(digest).decode(), signature=generic)
    assert not verify(key=b"other", body=body, header_value=base64.b64encode(digest).decode(), signature=generic)
