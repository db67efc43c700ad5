"""A sender's share of a consumer: at most `per_sender` of its messages at once, other senders unaffected."""

from __future__ import annotations

import pytest

from rockbot.bus.shares import InFlight


def test_a_sender_gets_its_share_and_no_more_and_gets_it_back_when_its_messages_are_done() -> None:
    share = InFlight(per_sender=2)
    with share.slot("agent.a.flooder") as first, share.slot("agent.a.flooder") as second:
        with share.slot("agent.a.flooder") as third, share.slot("agent.b.fair") as other:
            assert (first, second, third, other) == (True, True, False, True)
        assert share.held("agent.a.flooder") == 2 and share.held("agent.b.fair") == 0
    with pytest.raises(RuntimeError), share.slot("agent.a.flooder") as again:
        assert again
        raise RuntimeError("a failed handler gives its slot back too")
    assert share.held("agent.a.flooder") == 0


def test_a_share_holds_at_least_one() -> None:
    with pytest.raises(ValueError, match="per_sender=0 must be at least 1"):
        InFlight(per_sender=0)
