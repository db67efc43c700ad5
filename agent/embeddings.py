"""A client for an OpenAI-compatible embeddings endpoint (`POST {base_url}/embeddings`), for long-term memory.

One text in, one vector out, within `timeout_seconds` (the whole request: a memory waits for nothing
longer). Whatever goes wrong (no answer in time, an HTTP error, a body that is not an embedding) is
`EmbeddingsUnavailable` with a sentence saying what; after one, the endpoint is not asked again for
`quiet_seconds`, so a dead endpoint costs each turn nothing but the note that memory is off for now.
"""

from __future__ import annotations

import math
import time
from typing import Any

import aiohttp


class EmbeddingsUnavailable(Exception):
    """No embedding could be had; the message says why, for the model and the run."""


class Embedder:
    def __init__(
        self, *, base_url: str, model: str, api_key: str | None = None, timeout_seconds: float = 3.0,
        quiet_seconds: float = 30.0,
    ) -> None:  # fmt: skip
        self.model = model
        self._url = base_url.rstrip("/") + "/embeddings"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = timeout_seconds
        self._quiet = quiet_seconds
        self._failed: tuple[float, str] | None = None
        self._session: aiohttp.ClientSession | None = None

    async def embed(self, text: str) -> list[float]:
        """`text`'s embedding; `EmbeddingsUnavailable` when the endpoint fails, is slow, or failed a moment ago."""
        now = time.monotonic()
        if self._failed is not None and now < self._failed[0] + self._quiet:
            ago = now - self._failed[0]
            raise EmbeddingsUnavailable(f"{self._failed[1]} {ago:.0f} s ago; it is asked again "
                                        f"{self._quiet - ago:.0f} s from now")  # fmt: skip
        try:
            return _vector(await self._post(text))
        except EmbeddingsUnavailable as exc:
            self._failed = (now, str(exc))
            raise

    async def _post(self, text: str) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout))
        try:
            async with self._session.post(self._url, json={"model": self.model, "input": [text]},
                                          headers=self._headers) as response:  # fmt: skip
                if response.status >= 400:
                    detail = (await response.text())[:300].strip()
                    raise EmbeddingsUnavailable(f"the embeddings endpoint {self._url} answered {response.status} "
                                                f"for model {self.model!r}: {detail}")  # fmt: skip
                return await response.json(content_type=None)
        except TimeoutError:
            raise EmbeddingsUnavailable(f"the embeddings endpoint {self._url} did not answer within "
                                        f"{self._timeout:g} s") from None  # fmt: skip
        except (aiohttp.ClientError, ValueError) as exc:
            raise EmbeddingsUnavailable(f"the embeddings endpoint {self._url} failed: {exc}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _vector(body: Any) -> list[float]:
    """The one embedding of an answer (`{"data": [{"embedding": [...]}]}`), or `EmbeddingsUnavailable` naming what
    came instead."""
    try:
        vector = [float(x) for x in body["data"][0]["embedding"]]
    except (KeyError, IndexError, TypeError, ValueError):
        raise EmbeddingsUnavailable(f"the embeddings endpoint answered no embedding: {str(body)[:200]}") from None
    if not vector or (not math.isfinite(sum(vector)) and not all(map(math.isfinite, vector))) or not any(vector):
        raise EmbeddingsUnavailable("the embeddings endpoint answered an empty, zero or non-finite vector")
    return vector
