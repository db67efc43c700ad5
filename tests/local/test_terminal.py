"""`rockbot local` at the terminal: what a person sees while waiting, and how Ctrl-C ends it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import pathlib
import re
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence

from rockbot.agent.runtime import AgentRuntime
from rockbot.local.chat import Printer, ask
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.agent.test_llm import endpoint, streaming
from tests.fixtures.llm import ScriptedCall, Turn

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


class Stderr(io.StringIO):
    """A terminal's stderr that tells when a phrase has been written."""

    def __init__(self, phrase: str) -> None:
        super().__init__()
        self.phrase = phrase
        self.seen = asyncio.Event()

    def write(self, text: str) -> int:
        written = super().write(text)
        if self.phrase in self.getvalue():
            self.seen.set()
        return written


async def test_a_silent_model_shows_that_the_chat_is_waiting_for_it():
    err = Stderr("waiting for the model")

    async def answers_once_the_chat_said_it_waits(request):
        response = await streaming(request)
        await asyncio.wait_for(err.seen.wait(), 10)  # bound: the notice comes after 0.05 s of silence
        await response.write(b'data: {"choices": [{"index": 0, "delta": {"content": "Basalt"}, '
                             b'"finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
        return response

    async with endpoint(answers_once_the_chat_said_it_waits) as (url, _):
        config = agent_config(llm_url=url, name="m")
        printer = Printer(out=io.StringIO(), err=err, wait_notice_seconds=0.05)
        async with AgentRuntime.from_config(config, env={API_KEY_ENV: "k"}) as agent:
            assert await ask(agent, "rock?", printer=printer)
    assert printer.out.getvalue() == "Basalt\n"
    assert "waiting for the model" in err.getvalue() and "times out after 60 s" in err.getvalue()


class Chat:
    """`rockbot local` in a real process with a pipe as its terminal; reads its output as it comes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.stderr = ""

    async def wait_for(self, phrase: str, *, seconds: float = 60) -> None:
        """Until stderr shows `phrase` (bounded: the process starts its parts in a few seconds)."""
        async def read() -> None:
            while phrase not in self.stderr:
                line = await self.process.stderr.readline()
                if not line:
                    raise AssertionError(f"rockbot local ended before saying {phrase!r}: {self.stderr}")
                self.stderr += line.decode()

        await asyncio.wait_for(read(), seconds)

    async def exit_code(self, *, seconds: float = 15) -> int:
        """The exit code, waiting at most `seconds` for the process to end."""
        await asyncio.wait_for(self.process.communicate(), seconds)
        return self.process.returncode


async def start_chat(llm, *files: pathlib.Path, options: Sequence[str] = ()) -> Chat:
    clean = {key: value for key, value in os.environ.items() if not key.startswith("OPENAI_")}
    state = tempfile.mkdtemp(prefix="rockbot-local-state-")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rockbot.cli", "local", *[f"-f{file}" for file in files], "--webhook-port", "0",
        "--console-port", "0", *options,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**clean, "XDG_STATE_HOME": state, "OPENAI_BASE_URL": llm.url, "OPENAI_API_KEY": "sk-local",
             "OPENAI_MODEL": llm.model},
    )  # fmt: skip
    return Chat(process)


@contextlib.asynccontextmanager
async def local_console_of(llm, manifest: pathlib.Path, runs: pathlib.Path) -> AsyncIterator[tuple[str, Chat]]:
    """`rockbot local` running `manifest`, its runs kept in `runs`, its console on a free port with no login:
    (the console's URL, its terminal); ended as a person ends the chat (end of input)."""
    chat = await start_chat(llm, manifest, options=("--runs-database", str(runs)))
    try:
        await chat.wait_for("[type a message", seconds=60)
        url = re.search(r"\[console: (http://127\.0\.0\.1:\d+) \(no login", chat.stderr)
        assert url is not None, chat.stderr
        yield url.group(1), chat
    finally:
        if chat.process.returncode is None:
            chat.process.stdin.close()  # type: ignore[union-attr]
        await asyncio.wait_for(chat.process.wait(), 30)


async def test_ctrl_c_at_the_idle_prompt_exits_without_waiting_for_enter(scripted_llm):
    chat = await start_chat(scripted_llm, EXAMPLES / "analyst.yaml")
    try:
        await chat.wait_for("[type a message")
        chat.process.send_signal(signal.SIGINT)
        code = await chat.exit_code()
    finally:
        if chat.process.returncode is None:
            chat.process.kill()
            await chat.process.wait()
    assert code == 130
    assert "Traceback" not in chat.stderr


async def test_ctrl_c_while_a_script_runs_says_what_it_waits_for_and_a_second_one_quits(scripted_llm):
    sleeper = "import time\nprint('started', flush=True)\ntime.sleep(600)\n"
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": sleeper})]))
    chat = await start_chat(scripted_llm, EXAMPLES / "analyst.yaml")
    try:
        await chat.wait_for("[type a message")
        chat.process.stdin.write(b"sleep for ten minutes\n")
        await chat.wait_for("running execute_python_script")
        chat.process.send_signal(signal.SIGINT)
        await chat.wait_for("[stopping: ")
        chat.process.send_signal(signal.SIGINT)
        code = await chat.exit_code(seconds=10)
    finally:
        if chat.process.returncode is None:
            chat.process.kill()
            await chat.process.wait()
    assert code == 130
    assert "Ctrl-C again quits at once" in chat.stderr and "Traceback" not in chat.stderr
