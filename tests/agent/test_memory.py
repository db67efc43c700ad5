"""Chunking, working memory and conversation bounds: the pieces that keep the context window small."""

from __future__ import annotations

from rockbot.agent.chunking import split_into_chunks
from rockbot.agent.conversations import Conversations
from rockbot.agent.memory import WorkingMemory


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_headings_start_chunks_and_name_them():
    text = "intro\n\n# One\nfirst\n## Two\nsecond\n### Three\nthird\n"
    chunks = split_into_chunks(text, max_chars=16)
    assert [(c.heading, c.text) for c in chunks] == [
        ("Part 0", "intro\n\n"), ("One", "# One\nfirst\n"), ("Two", "## Two\nsecond\n"), ("Three", "### Three\nthird\n")
    ]


def test_headings_inside_code_fences_do_not_split():
    text = "# Real\n```\n# not a heading\n```\n"
    assert [c.heading for c in split_into_chunks(text, max_chars=1000)] == ["Real"]


def test_long_sections_split_at_blank_lines_then_hard():
    paragraphs = "\n\n".join(f"para {n} " + "x" * 40 for n in range(10))
    chunks = split_into_chunks(f"# Big\n{paragraphs}\n" + "y" * 250, max_chars=100)
    assert all(len(c.text) <= 100 for c in chunks) and {c.heading for c in chunks} == {"Big"}
    assert "".join(c.text for c in chunks) == f"# Big\n{paragraphs}\n" + "y" * 250
    assert sum(1 for c in chunks if set(c.text) == {"y"}) == 2  # the unbroken tail was cut hard


def test_working_memory_expires_entries():
    clock = Clock()
    memory = WorkingMemory(ttl_seconds=60, clock=clock)
    memory.put(session_id="s", key="k", value="v")
    assert memory.get(session_id="s", key="k") == "v" and memory.get(session_id="other", key="k") is None
    clock.now += 61
    assert memory.get(session_id="s", key="k") is None and memory.keys(session_id="s") == []


def test_working_memory_keeps_a_bounded_number_of_entries_per_session():
    memory = WorkingMemory(max_entries_per_session=3)
    for n in range(5):
        memory.put(session_id="s", key=f"k{n}", value=str(n))
    assert memory.keys(session_id="s") == ["k2", "k3", "k4"]


def test_small_sections_are_packed_together_up_to_the_limit():
    text = "".join(f"# H{n}\nbody {n}\n" for n in range(10))
    chunks = split_into_chunks(text, max_chars=40)
    assert "".join(c.text for c in chunks) == text
    assert all(len(c.text) <= 40 for c in chunks) and len(chunks) == 4
    assert [c.title for c in chunks][:2] == ["H0 (+2 more)", "H3 (+2 more)"]


def test_offload_returns_short_content_unchanged_and_indexes_long_content():
    memory = WorkingMemory()
    assert memory.offload(session_id="s", tool_name="t", content="short", threshold=1000) == "short"
    index = memory.offload(session_id="s", tool_name="t", content="# A\n" + "a" * 3000, threshold=1000)
    keys = memory.keys(session_id="s")
    assert len(keys) == 7 and f"`{keys[0]}` to `{keys[-1]}`" in index
    assert "get_from_working_memory(key)" in index and len(index) <= 1000 // 4


def test_thousands_of_short_sections_give_a_few_chunks_and_an_index_far_below_the_threshold():
    """Issue 12, bug 3: 113 kB under 6,000 headings became 6,001 chunks and a 417,039-character index."""
    text = "".join(f"## Item {n}\nvalue {n}\n" for n in range(6000))
    memory = WorkingMemory()
    index = memory.offload(session_id="s", tool_name="list_items", content=text, threshold=16_000)
    keys = memory.keys(session_id="s")
    assert len(keys) <= 64 and len(index) <= 16_000 // 4
    assert "".join(memory.get(session_id="s", key=k) for k in keys) == text
    assert all(f"`{key}`" in index or f"{key}:" in index for key in (keys[0], keys[-1]))


def test_only_keys_that_memory_still_holds_are_handed_out():
    memory = WorkingMemory(max_entries_per_session=8)
    text = "".join(f"# Part {n}\n" + "x" * 900 + "\n" for n in range(40))
    index = memory.offload(session_id="s", tool_name="big", content=text, threshold=1000)
    keys = memory.keys(session_id="s")
    assert len(keys) == 8 and f"`{keys[0]}` to `{keys[-1]}`" in index
    assert all(memory.get(session_id="s", key=k) for k in keys)
    assert "Only its first 7280 characters fit (32 chunks left out)." in index
    assert len(index) <= 1000 // 4


def history(turns: int) -> list[dict]:
    messages = []
    for n in range(turns):
        messages += [
            {"role": "user", "content": f"q{n}"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{n}"}]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": "r"},
            {"role": "assistant", "content": f"a{n}"},
        ]
    return messages


def test_conversations_drop_whole_old_turns():
    conversations = Conversations(max_messages=6)
    conversations.save("s", history(3))
    kept = conversations.history("s")
    assert kept[0] == {"role": "user", "content": "q2"} and len(kept) == 4


def test_conversations_forget_the_least_recently_used_session():
    conversations = Conversations(max_sessions=2)
    for session in ("a", "b"):
        conversations.save(session, history(1))
    conversations.save("a", history(1))
    conversations.save("c", history(1))
    assert (conversations.history("b"), len(conversations)) == ([], 2)
    assert conversations.history("a") and conversations.history("c")


def test_history_is_a_copy():
    conversations = Conversations()
    conversations.save("s", history(1))
    conversations.history("s").clear()
    assert len(conversations.history("s")) == 4
