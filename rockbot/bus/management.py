"""RabbitMQ's HTTP management API, for provisioning (see `admin.BrokerAdmin`): only the operator holds it.

Every `ensure_*` reads first and writes only what differs: a password is compared against the
stored salted hash (RabbitMQ's own scheme), permissions and queue arguments as they are, so a
settled broker costs GETs only. A new user is made unable to log in, then its queues, their bindings,
its permissions and limits are written, those that do not depend on each other at once, and its
password last; what this admin has just made is not read back (a new Agent costs 15 calls, 27 when
everything was read back, in 5 rounds instead of 15 one after the other). The admin login is used for
these calls and nothing else.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
from collections.abc import Sequence
from typing import Any, Self
from urllib.parse import quote

import aiohttp
from yarl import URL

from rockbot.bus.admin import QUEUE_HEADER, REASON_HEADER, SENDER_HEADER, DeadLetter, where_and_why
from rockbot.bus.errors import BusError
from rockbot.bus.permissions import Limits, Permissions
from rockbot.bus.topology import (
    DEAD_LETTER_EXCHANGE,
    DEAD_LETTER_INTAKE,
    DEAD_LETTER_RECORDS_EXCHANGE,
    DEAD_LETTERS,
    EXCHANGE,
    FIXED_QUEUES,
    Queue,
    dead_letter_record,
    is_dead_letter_record,
)

MANAGEMENT_PORT = 15672
_GET_RETRY_PAUSES = (0.1, 0.5)
_HASHES = {"rabbit_password_hashing_sha256": hashlib.sha256, "rabbit_password_hashing_sha512": hashlib.sha512}


class ManagementError(BusError):
    """The management API refused a call or could not be reached."""


class _ServerError(ManagementError):
    """The management API failed (5xx); a read is worth trying again."""


def password_matches(*, password_hash: str, algorithm: str, password: str) -> bool:
    """Whether `password` is the one RabbitMQ stored as `password_hash` (base64 of 4 salt bytes + digest)."""
    hasher = _HASHES.get(algorithm)
    if hasher is None or not password_hash:
        return False
    raw = base64.b64decode(password_hash)
    salt, digest = raw[:4], raw[4:]
    return hmac.compare_digest(hasher(salt + password.encode()).digest(), digest)


class RabbitAdmin:
    """Administers one virtual host of one broker; use as `async with RabbitAdmin(...) as admin`."""

    def __init__(self, *, url: str, username: str, password: str, vhost: str = "/", timeout: float = 10.0) -> None:
        self._base = URL(url.rstrip("/") + "/api")
        self._vhost = quote(vhost, safe="")
        self.vhost = vhost
        self._auth = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        #: Users this admin made (unable to log in) and has not given a password since: nothing to read back.
        self._locked: set[str] = set()

    @classmethod
    def for_amqp_url(cls, amqp_url: str, *, management_url: str | None = None) -> RabbitAdmin:
        """The management API of the broker an (administrator's) AMQP URL points at, with the same login.

        Its address is `management_url`, or the AMQP host on port 15672.
        """
        amqp = URL(amqp_url)
        url = management_url or str(URL.build(scheme="http", host=amqp.host or "localhost", port=MANAGEMENT_PORT))
        vhost = amqp.path[1:] or "/"
        return cls(url=url, username=amqp.user or "guest", password=amqp.password or "guest", vhost=vhost)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ---- the BrokerAdmin operations

    async def ensure_topology(self) -> None:
        await self._ensure_exchange(EXCHANGE, kind="topic")
        await self._ensure_exchange(DEAD_LETTER_EXCHANGE, kind="fanout")
        await self._ensure_queue(DEAD_LETTERS, exchange=DEAD_LETTER_EXCHANGE, routing_key="")
        await self._ensure_queue(DEAD_LETTER_INTAKE, exchange=DEAD_LETTER_EXCHANGE, routing_key="")
        await self._ensure_exchange(DEAD_LETTER_RECORDS_EXCHANGE, kind="direct")
        await self._unbind_records_from(EXCHANGE)
        for queue in FIXED_QUEUES:
            await self.ensure_queue(queue)

    async def ensure_queue(self, queue: Queue) -> bool:
        return await self._ensure_queue(queue, exchange=queue.exchange, routing_key=queue.name)

    async def create_user(
        self, *, user: str, tags: Sequence[str], permissions: Permissions, limits: Limits, queues: Sequence[Queue]
    ) -> bool:
        name = quote(user, safe="")
        if await self._get(f"users/{name}") is not None:
            return False
        # Each setting in a call of its own, those that do not depend on each other at once: the broker's import
        # of definitions (one call for all) runs on a pool of two workers and took 2.8 s per new Agent at p50 with
        # 8 at once, these 0.5 s one after the other.
        await self._call("PUT", f"users/{name}", {"password_hash": "", "tags": ",".join(tags)})  # no login yet
        paths = {queue.name: f"{self._vhost}/{quote(queue.name, safe='')}" for queue in queues}
        await asyncio.gather(*(self._call("PUT", f"queues/{paths[queue.name]}",
                                          {"durable": True, "arguments": queue.arguments}) for queue in queues))
        exchange = quote(EXCHANGE, safe="")
        await asyncio.gather(
            *(self._call("POST", f"bindings/{self._vhost}/e/{exchange}/q/{quote(queue.name, safe='')}",
                         {"routing_key": queue.name}) for queue in queues),
            self._call("PUT", f"permissions/{self._vhost}/{name}", {
                "configure": permissions.configure, "write": permissions.write, "read": permissions.read}),
            self._call("PUT", f"topic-permissions/{self._vhost}/{name}", {
                "exchange": EXCHANGE, "write": permissions.topic_write, "read": permissions.topic_read}),
            self._call("PUT", f"user-limits/{name}/max-connections", {"value": limits.max_connections}),
            self._call("PUT", f"user-limits/{name}/max-channels", {"value": limits.max_channels}),
        )  # fmt: skip
        self._locked.add(user)
        return True

    async def ensure_user(self, *, user: str, password: str, tags: Sequence[str] = ()) -> bool:
        name = quote(user, safe="")
        if user in self._locked:
            self._locked.discard(user)
            existing: Any = {"tags": list(tags), "password_hash": ""}  # as this admin made it, moments ago
        else:
            existing = await self._get(f"users/{name}")
        if existing is not None and sorted(existing.get("tags") or []) == sorted(tags) and password_matches(
            password_hash=existing.get("password_hash", ""), algorithm=existing.get("hashing_algorithm", ""),
            password=password,
        ):  # fmt: skip
            return False
        await self._call("PUT", f"users/{name}", {"password": password, "tags": ",".join(tags)})
        return True

    async def ensure_permissions(self, *, user: str, permissions: Permissions) -> bool:
        wrote = False
        name = quote(user, safe="")
        wanted = {"configure": permissions.configure, "write": permissions.write, "read": permissions.read}
        current = await self._get(f"permissions/{self._vhost}/{name}") or {}
        if {key: current.get(key) for key in wanted} != wanted:
            await self._call("PUT", f"permissions/{self._vhost}/{name}", wanted)
            wrote = True
        topic = {"exchange": EXCHANGE, "write": permissions.topic_write, "read": permissions.topic_read}
        listed = await self._get(f"topic-permissions/{self._vhost}/{name}") or []
        current_topic = next((item for item in listed if item.get("exchange") == EXCHANGE), {})
        if {key: current_topic.get(key) for key in topic} != topic:
            await self._call("PUT", f"topic-permissions/{self._vhost}/{name}", topic)
            wrote = True
        return wrote

    async def ensure_limits(self, *, user: str, limits: Limits) -> bool:
        name = quote(user, safe="")
        wanted = {"max-connections": limits.max_connections, "max-channels": limits.max_channels}
        listed = await self._get(f"user-limits/{name}") or []
        current = next((item.get("value") or {} for item in listed if item.get("user") == user), {})
        wrote = False
        for limit, value in wanted.items():
            if current.get(limit) != value:
                await self._call("PUT", f"user-limits/{name}/{limit}", {"value": value})
                wrote = True
        return wrote

    async def delete_user(self, user: str) -> bool:
        self._locked.discard(user)
        name = quote(user, safe="")
        vhosts = {item["vhost"] for item in await self._get(f"users/{name}/permissions") or []}
        if await self._get(f"users/{name}") is None:
            return False
        if vhosts <= {self.vhost}:
            await self._call("DELETE", f"users/{name}")
        else:  # the same user name in another virtual host (another installation) keeps its access there
            await self._call("DELETE", f"permissions/{self._vhost}/{name}")
            await self._call("DELETE", f"topic-permissions/{self._vhost}/{name}", missing_ok=True)
        return True

    async def delete_queue(self, queue: Queue) -> bool:
        path = f"queues/{self._vhost}/{quote(queue.name, safe='')}"
        return await self._call("DELETE", path, missing_ok=True, missing=False) is not False

    async def users(self, *, tag: str) -> set[str]:
        here = {item["user"] for item in await self._get(f"vhosts/{self._vhost}/permissions") or []}
        tagged = {item["name"] for item in await self._get("users") or [] if tag in (item.get("tags") or [])}
        return here & tagged

    async def dead_letters(self, *, count: int = 100, sender: str | None = None) -> list[DeadLetter]:
        queue = DEAD_LETTERS if sender is None else dead_letter_record(sender)
        taken = await self._call(
            "POST",
            f"queues/{self._vhost}/{quote(queue.name, safe='')}/get",
            {"count": count, "ackmode": "ack_requeue_true", "encoding": "auto"},
            missing_ok=True,
        )
        return [_dead_letter(item, filed=sender is not None) for item in taken or []]

    # ---- helpers

    async def _ensure_exchange(self, name: str, *, kind: str) -> None:
        path = f"exchanges/{self._vhost}/{quote(name, safe='')}"
        if await self._get(path) is None:
            await self._call("PUT", path, {"type": kind, "durable": True})

    async def _unbind_records_from(self, exchange: str) -> None:
        """Remove the bindings of dead-letter records to `exchange` that an older rockbot made (records were bound to
        `rockbot`, where a copy of any message sent there could reach them: `topology.DEAD_LETTER_RECORDS_EXCHANGE`)."""
        source = quote(exchange, safe="")
        for binding in await self._get(f"exchanges/{self._vhost}/{source}/bindings/source") or []:
            queue = str(binding.get("destination", ""))
            if binding.get("destination_type") == "queue" and is_dead_letter_record(queue):
                key = quote(str(binding.get("properties_key", "")), safe="")
                await self._call("DELETE", f"bindings/{self._vhost}/e/{source}/q/{quote(queue, safe='')}/{key}",
                                 missing_ok=True)

    async def _ensure_queue(self, queue: Queue, *, exchange: str, routing_key: str) -> bool:
        wrote = False
        name = quote(queue.name, safe="")
        existing = await self._get(f"queues/{self._vhost}/{name}")
        bindings = f"bindings/{self._vhost}/e/{quote(exchange, safe='')}/q/{name}"
        if existing is None:  # declared (the same again changes nothing, other arguments are refused), then bound
            await self._call("PUT", f"queues/{self._vhost}/{name}", {"durable": True, "arguments": queue.arguments})
            await self._call("POST", bindings, {"routing_key": routing_key})
            return True
        if (existing.get("arguments") or {}) != queue.arguments:
            raise ManagementError(
                f"queue {queue.name!r} exists with arguments {existing.get('arguments')}, not {queue.arguments}: "
                "an older rockbot declared it; delete it once it is empty (rabbitmqctl delete_queue) and it is "
                "declared anew"
            )
        if not any(item.get("routing_key") == routing_key for item in await self._get(bindings) or []):
            await self._call("POST", bindings, {"routing_key": routing_key})
            wrote = True
        return wrote

    async def _get(self, path: str) -> Any:
        """A read, tried again on a server error: listing users while one is deleted can answer 500."""
        for pause in _GET_RETRY_PAUSES:
            try:
                return await self._call("GET", path, missing_ok=True)
            except _ServerError:
                await asyncio.sleep(pause)
        return await self._call("GET", path, missing_ok=True)

    async def _call(
        self, method: str, path: str, body: Any = None, *, missing_ok: bool = False, missing: Any = None
    ) -> Any:
        """The call's JSON answer; `missing` for a 404 when `missing_ok`, else `ManagementError` for any failure."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout, headers={"Authorization": self._auth})
        url = URL(f"{self._base}/{path}", encoded=True)
        try:
            async with self._session.request(method, url, json=body) as response:
                text = await response.text()
                if response.status == 404 and missing_ok:
                    return missing
                if response.status >= 300:
                    raise (_ServerError if response.status >= 500 else ManagementError)(
                        f"the broker's management API answered {method} /api/{path} with {response.status}: "
                        f"{text[:300]}"
                    )
                return json.loads(text) if text else None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ManagementError(f"no answer from the broker's management API at {self._base}: {exc!r}") from exc


def _dead_letter(item: dict[str, Any], *, filed: bool) -> DeadLetter:
    """A dead letter as the broker shows it; one `filed` into a sender's record names its sender, where and why it
    died in headers the operator set (its `user_id` is the operator's), any other header of a message being its
    sender's own (where and why it died then comes from the entry the broker wrote into its `x-death`)."""
    properties = item.get("properties") or {}
    headers = properties.get("headers") or {}
    died = {key: str(headers.get(key, "")) for key in (QUEUE_HEADER, REASON_HEADER)} if filed else where_and_why(
        headers)
    payload = item.get("payload", "")
    body = base64.b64decode(payload) if item.get("payload_encoding") == "base64" else payload.encode()
    return DeadLetter(
        queue=died.get(QUEUE_HEADER, ""),
        reason=died.get(REASON_HEADER, ""),
        user_id=headers.get(SENDER_HEADER) if filed else properties.get("user_id"),
        message_id=properties.get("message_id"),
        message_type=properties.get("type"),
        body=body,
    )
