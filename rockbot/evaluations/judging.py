"""The judge of rubric cases: a model reads the case's input, the agent's answer and the criteria, and scores.

The judge is its own endpoint (the rubric's `judge`, else the Evaluation's), never the agent under test, so
a prompt change cannot grade itself. It must reply with one JSON object `{"score": 0..1, "reason": "..."}`;
anything else is the judge failing (the case run is an Error, not a pass or a fail). The request goes
through the agent's own Chat Completions client (retries, timeouts), not through any agent.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from rockbot.agent.llm import LlmClient, LlmError

INSTRUCTIONS = (
    "You grade an AI agent's answer against criteria. Read the user's input, the agent's answer and the criteria. "
    'Reply with one JSON object and nothing else: {"score": <a number from 0 to 1>, "reason": "<one sentence>"}, '
    "where 1 means the answer meets the criteria fully and 0 not at all."
)


class JudgeError(Exception):
    """The judge gave no usable score (unreachable, refused, or not the JSON asked for)."""


@dataclass(frozen=True)
class Grade:
    score: float
    reason: str


@dataclass(frozen=True)
class Judge:
    """An endpoint that grades: `api_key` already read from wherever its Secret is."""

    base_url: str
    model: str
    api_key: str | None = None
    timeout_seconds: float = 60.0

    async def grade(self, *, criteria: str, input: str, answer: str) -> Grade:
        client = LlmClient(base_url=self.base_url, model=self.model, api_key=self.api_key,
                           timeout_seconds=self.timeout_seconds, max_attempts=2)  # fmt: skip
        messages = [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": f"Input:\n{input}\n\nAnswer:\n{answer}\n\nCriteria:\n{criteria}"},
        ]
        try:
            completion = await client.complete(messages=messages, stream=False)
        except LlmError as exc:
            raise JudgeError(f"{self.model} at {self.base_url}: {exc}") from exc
        finally:
            await client.close()
        return parse_grade(completion.content)


def parse_grade(text: str) -> Grade:
    """The judge's JSON reply as a grade (the first {...} in it, so a sentence around it does no harm)."""
    found = re.search(r"\{.*\}", text, flags=re.DOTALL)
    try:
        data = json.loads(found.group(0)) if found else None
    except json.JSONDecodeError:
        data = None
    score = data.get("score") if isinstance(data, dict) else None
    if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
        raise JudgeError(f'the judge did not reply {{"score": 0..1, "reason": ...}} but {text[:200]!r}')
    return Grade(score=float(score), reason=str(data.get("reason", ""))[:500])  # type: ignore[union-attr]
