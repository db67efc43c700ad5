"""What the run page shows: a run's trace linked in the tracing UI when the console is told its URL template, and
where each script ran."""

from __future__ import annotations

import datetime

from rockbot.console.store_models import RunDetail, TimelineEntry
from rockbot.console.web.pages import templates

NOW = datetime.datetime(2026, 11, 25, 17, 0, tzinfo=datetime.UTC)
RUN = RunDetail(
    run_id="r1", namespace="team-a", agent="helper", source="chat", caller="http", session_id="s1", parent_run_id=None,
    request_id="q1", trace_id="4bf92f3577b34da6a3ce929d0e0e4736", model="m", record="Full", started_at=NOW,
    ended_at=NOW, outcome="Succeeded", error="", prompt_tokens=1, completion_tokens=1, tool_calls=0,
    expires_at=NOW, timeline=[],
)  # fmt: skip


def render(trace_url_template: str | None, run: RunDetail = RUN) -> str:
    environment = templates()
    environment.globals.update(trace_url_template=trace_url_template, runs_on=True, approvals_on=False,
                               memories_on=False)
    return environment.get_template("run.html").render(run=run, user="alice", csrf="", csrf_field="csrf",
                                                         can_log_out=False)


def test_a_runs_trace_links_to_the_tracing_ui_only_when_told_where_it_is() -> None:
    linked = render("https://jaeger.example.com/trace/{trace_id}")
    assert 'href="https://jaeger.example.com/trace/4bf92f3577b34da6a3ce929d0e0e4736"' in linked
    assert "<code>4bf92f3577b34da6a3ce929d0e0e4736</code>" in render(None)


def test_a_script_entry_says_which_backend_and_pod_ran_it() -> None:
    script = TimelineEntry(event_id="e1", kind="script_run", at=NOW, name="pods", status="0", duration_seconds=1.2,
                           data={"exit_code": 0, "stdout": "42\n", "stderr": "", "backend": "pods",
                                 "pod": "rockbot-script-0a1b2c3d4e-5f6a7b"})  # fmt: skip
    page = render(None, RUN.model_copy(update={"timeline": [script]}))
    assert "exit code 0, ran on pods in pod rockbot-script-0a1b2c3d4e-5f6a7b" in page
