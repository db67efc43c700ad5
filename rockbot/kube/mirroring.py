"""Mirror a kind of object into callbacks: list, then watch from the list's resourceVersion, forever.

Watches end (server timeouts, API restarts) and resourceVersions expire (410 Gone): a stream that
ends is resumed from the last version seen, an expired one is listed afresh, and objects that
vanished in between are reported deleted. Any other failure is logged and the mirror lists again.
The scheduler and the gateway mirror what they need themselves rather than riding on kopf's, so they
run (and are tested) on any event loop with nothing but a `KubeClient`; the operator mirrors the
children it owns (by label), which costs far less per event than a kopf handler.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from rockbot.kube import ApiError, Gone, KubeClient, Resource

log = logging.getLogger(__name__)

Key = tuple[str, str]
WATCH_TIMEOUT_SECONDS = 300
#: Objects per page of a list (the API server's own default chunk size for its watch cache is 500).
LIST_PAGE = 250
RETRY_SECONDS = 1.0


async def mirror(
    *,
    kube: KubeClient,
    resource: Resource,
    namespace: str | None,
    on_upsert: Callable[[dict[str, Any]], None],
    on_delete: Callable[[str, str], None],
    label_selector: str | None = None,
    on_listed: Callable[[list[dict[str, Any]]], None] | None = None,
    on_synced: Callable[[], None] | None = None,
    forbidden_ends: bool = False,
) -> None:
    """Call `on_upsert(body)` for every object and change, `on_delete(namespace, name)` for removals.

    A (re)list is read a page at a time (`LIST_PAGE` objects), so its objects are never all in
    memory at once; with `on_listed`, a page is handed over whole instead of object by object.
    Once a list is done (and what vanished reported deleted), `on_synced()`: the mirror is complete.
    `forbidden_ends`: a 401 or 403 is raised (the caller can do without) instead of tried again.
    """
    known: set[Key] = set()
    while True:
        try:
            seen: set[Key] = set()
            version = ""
            async for page in kube.list_pages(resource, namespace=namespace, label_selector=label_selector,
                                              limit=LIST_PAGE):  # fmt: skip
                seen |= {_key(item) for item in page.items}
                if on_listed is not None:
                    on_listed(page.items)
                else:
                    for item in page.items:
                        on_upsert(item)
                version = version or page.resource_version  # the snapshot's: watch from there
            for key in known - seen:
                on_delete(*key)
            known = seen
            if on_synced is not None:
                on_synced()
            while True:
                async for event in kube.watch(
                    resource, namespace=namespace, label_selector=label_selector, resource_version=version,
                    timeout_seconds=WATCH_TIMEOUT_SECONDS,
                ):  # fmt: skip
                    version = event.object.get("metadata", {}).get("resourceVersion") or version
                    if event.type == "BOOKMARK":
                        continue
                    key = _key(event.object)
                    if event.type == "DELETED":
                        known.discard(key)
                        on_delete(*key)
                    else:
                        known.add(key)
                        on_upsert(event.object)
        except Gone:
            log.info("watch of %s expired; listing again", resource.plural)
        except (ApiError, aiohttp.ClientError, OSError) as exc:
            if forbidden_ends and isinstance(exc, ApiError) and exc.status in (401, 403):
                raise
            log.warning("watching %s failed (%s); retrying in %s s", resource.plural, exc, RETRY_SECONDS)
            await asyncio.sleep(RETRY_SECONDS)
        except Exception:  # a bug must not end the mirror for good: log it, list afresh
            log.exception("watching %s failed unexpectedly; listing again in %s s", resource.plural, RETRY_SECONDS)
            await asyncio.sleep(RETRY_SECONDS)


def _key(body: dict[str, Any]) -> Key:
    metadata = body.get("metadata") or {}
    return metadata.get("namespace", ""), metadata.get("name", "")
