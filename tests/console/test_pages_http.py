"""The console over HTTP as a browser speaks it: login, sessions, what RBAC lets a user see, CSRF, hostile text."""

from __future__ import annotations

import re

import aiohttp

from rockbot.console.auth_sessions import COOKIE_NAME
from rockbot.kube import AGENTS, KubeClient
from tests.console.conftest import Console, Rbac, agent_body, service_account_token

VIEW = "[{apiGroups: [rockbot.dev], resources: [agents], verbs: [get, list]}]"
HTML = {"Accept": "text/html"}


async def log_in(http: aiohttp.ClientSession, console: Console, token: str) -> tuple[str, str]:
    """The session cookie and the CSRF token of a fresh login with `token`."""
    async with http.post(f"{console.url}/login", data={"token": token}, allow_redirects=False) as answer:
        assert answer.status == 303, await answer.text()
        cookie = answer.cookies[COOKIE_NAME]
    async with http.get(f"{console.url}/agents", headers={**HTML, "Cookie": f"{COOKIE_NAME}={cookie.value}"}) as page:
        assert page.status == 200
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', await page.text())
    assert csrf is not None
    return cookie.value, csrf.group(1)


async def test_a_page_without_login_goes_to_the_login_page(console: Console) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{console.url}/agents", headers=HTML, allow_redirects=False) as answer:
            assert (answer.status, answer.headers["Location"]) == (303, "/login")
        async with http.get(f"{console.url}/agents", allow_redirects=False) as answer:
            assert answer.status == 401
        async with http.get(f"{console.url}/login") as answer:
            assert answer.status == 200
            assert "script-src 'self'" in answer.headers["Content-Security-Policy"]
            assert "default-src 'none'" in answer.headers["Content-Security-Policy"]


async def test_login_keeps_the_session_in_a_strict_cookie(
    console: Console, kube_admin: KubeClient, namespaces: list[str]
) -> None:
    token = await service_account_token(kube_admin, namespace=namespaces[0], name="alice")
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{console.url}/login", data={"token": "wrong"}, allow_redirects=False) as answer:
            assert answer.status == 401
            assert COOKIE_NAME not in answer.cookies
        async with http.post(f"{console.url}/login", data={"token": token}, allow_redirects=False) as answer:
            assert answer.status == 303
            cookie = answer.cookies[COOKIE_NAME]
    assert cookie["httponly"] and cookie["secure"] and cookie["samesite"] == "Strict" and cookie["path"] == "/"
    assert token not in cookie.value


async def test_a_user_sees_only_the_agents_rbac_lets_them_see(
    rbac: Rbac, console: Console, kube_admin: KubeClient, namespaces: list[str]
) -> None:
    mine, other = namespaces
    await kube_admin.create(AGENTS, body=agent_body(namespace=mine, name="visible"))
    await kube_admin.create(AGENTS, body=agent_body(namespace=other, name="elsewhere"))
    token = await service_account_token(kube_admin, namespace=mine, name="alice")
    rbac.grant(namespace=mine, user=f"system:serviceaccount:{mine}:alice", rules=VIEW, name="console-viewer")
    async with aiohttp.ClientSession() as http:
        cookie, _ = await log_in(http, console, token)
        jar = {**HTML, "Cookie": f"{COOKIE_NAME}={cookie}"}
        async with http.get(f"{console.url}/agents", headers=jar) as page:
            text = await page.text()
        assert "visible" in text and "elsewhere" not in text and other not in text
        async with http.get(f"{console.url}/agents/{mine}/visible", headers=jar) as page:
            assert page.status == 200
        async with http.get(f"{console.url}/agents/{other}/elsewhere", headers=jar) as page:
            assert page.status == 403
        async with http.get(f"{console.url}/agents/{other}/no-such-agent", headers=jar) as page:
            assert page.status == 403  # the same answer whether or not it exists


async def test_what_an_agent_wrote_is_shown_as_text(
    rbac: Rbac, console: Console, kube_admin: KubeClient, namespaces: list[str]
) -> None:
    mine = namespaces[0]
    hostile = '<script>alert("owned")</script><img src=x onerror=alert(1)>'
    await kube_admin.create(AGENTS, body=agent_body(namespace=mine, name="hostile", description=hostile))
    token = await service_account_token(kube_admin, namespace=mine, name="alice")
    rbac.grant(namespace=mine, user=f"system:serviceaccount:{mine}:alice", rules=VIEW, name="console-viewer")
    async with aiohttp.ClientSession() as http:
        cookie, _ = await log_in(http, console, token)
        async with http.get(f"{console.url}/agents/{mine}/hostile",
                            headers={**HTML, "Cookie": f"{COOKIE_NAME}={cookie}"}) as page:
            text = await page.text()
    assert "<script>alert" not in text and "<img src=x" not in text
    assert "&lt;script&gt;alert(&#34;owned&#34;)&lt;/script&gt;" in text


async def test_state_changes_need_the_csrf_token_and_the_same_site(
    console: Console, kube_admin: KubeClient, namespaces: list[str]
) -> None:
    token = await service_account_token(kube_admin, namespace=namespaces[0], name="alice")
    async with aiohttp.ClientSession() as http:
        cookie, csrf = await log_in(http, console, token)
        jar = {"Cookie": f"{COOKIE_NAME}={cookie}"}
        logout = f"{console.url}/logout"
        async with http.post(logout, headers=jar, data={}, allow_redirects=False) as answer:
            assert answer.status == 403  # no CSRF token
        async with http.post(logout, headers={**jar, "Origin": "https://evil.example"}, data={"csrf": csrf},
                             allow_redirects=False) as answer:
            assert answer.status == 403  # right token, wrong site
        async with http.post(logout, headers={**jar, "Sec-Fetch-Site": "cross-site"}, data={"csrf": csrf},
                             allow_redirects=False) as answer:
            assert answer.status == 403
        assert console.sessions.find(cookie) is not None  # nothing changed
        async with http.post(logout, headers={**jar, "Origin": console.url}, data={"csrf": csrf},
                             allow_redirects=False) as answer:
            assert answer.status == 303
        assert console.sessions.find(cookie) is None
        async with http.get(f"{console.url}/agents", headers=jar, allow_redirects=False) as answer:
            assert answer.status == 401
