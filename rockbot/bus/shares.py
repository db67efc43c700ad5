"""Each sender's share of a consumer: at most `per_sender` of its messages handled at once.

A queue every agent may write to is shared, and handled first come, first served: one agent's flood of
requests that each take a while (a model turn, a database query, Kubernetes API calls) would fill the
consumer's prefetch and stand before every other agent's request. With a share, the sender's requests past
it are answered at once (or refused), so the flood is worked through as fast as it arrives and another
sender's request waits for the sender's share at most, never for the flood.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class InFlight:
    """How many of each sender's messages this consumer handles now, and whether one more may start."""

    def __init__(self, *, per_sender: int) -> None:
        if per_sender < 1:
            raise ValueError(f"per_sender={per_sender} must be at least 1")
        self.per_sender = per_sender
        self._held: dict[str, int] = {}

    def held(self, sender: str) -> int:
        return self._held.get(sender, 0)

    @contextlib.contextmanager
    def slot(self, sender: str) -> Iterator[bool]:
        """Within: True when the sender's message may be handled now, False when its share is in flight."""
        if self.held(sender) >= self.per_sender:
            yield False
            return
        self._held[sender] = self.held(sender) + 1
        try:
            yield True
        finally:
            self._held[sender] -= 1
            if not self._held[sender]:
                del self._held[sender]
