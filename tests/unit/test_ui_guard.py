"""Who may use orch ui's page: the token on every request, loopback names only, and
actions as same-origin POSTs with the token in a header (orchestrator/ui/guard.py)."""

from __future__ import annotations

import pytest

from orchestrator.ui.guard import Guard, Verdict, new_token

PORT = 40123
TOKEN = "t0ken-Of-This-Run"
GUARD = Guard(TOKEN, PORT)
HOST = {"host": f"127.0.0.1:{PORT}"}


def judge(method: str, path: str, query: dict[str, str], **headers: str) -> Verdict:
    return GUARD.judge(method, path, query, {**HOST, **headers})


def test_a_page_with_the_token_in_its_address_is_served() -> None:
    assert judge("GET", "/", {"token": TOKEN}) is Verdict.ALLOW
    assert judge("GET", "/api/jobs/events", {"token": TOKEN}) is Verdict.ALLOW
    assert judge("HEAD", "/static/app.js", {}, **{"x-orch-token": TOKEN}) is Verdict.ALLOW


@pytest.mark.parametrize("query", [{}, {"token": ""}, {"token": "wrong"}, {"token": TOKEN + "x"}])
def test_a_request_without_the_token_is_forbidden(query: dict[str, str]) -> None:
    for path in ("/", "/static/app.js", "/api/jobs", "/api/job/x/curves.csv", "/nosuch"):
        assert judge("GET", path, query) is Verdict.FORBIDDEN


def test_only_the_loopback_names_of_this_port_are_answered() -> None:
    """A site that points its own name at 127.0.0.1 (DNS rebinding) is refused."""
    for host in ("evil.example:40123", "127.0.0.1:80", "127.0.0.1", "", "10.0.0.1:40123"):
        verdict = GUARD.judge("GET", "/", {"token": TOKEN}, {"host": host})
        assert verdict is Verdict.FORBIDDEN, host
    localhost = GUARD.judge("GET", "/", {"token": TOKEN}, {"host": f"localhost:{PORT}"})
    assert localhost is Verdict.ALLOW


def test_an_action_is_a_post_with_the_token_in_its_header() -> None:
    header = {"x-orch-token": TOKEN}
    assert judge("POST", "/api/action/kill/j1", {}, **header) is Verdict.ALLOW
    assert judge("GET", "/api/action/kill/j1", {}, **header) is Verdict.NOT_ALLOWED
    # In the address only, a link or a form of any page could carry it: refused.
    assert judge("POST", "/api/action/kill/j1", {"token": TOKEN}) is Verdict.FORBIDDEN
    assert judge("POST", "/api/action/kill/j1", {}) is Verdict.FORBIDDEN


def test_an_action_from_another_origin_is_refused() -> None:
    header = {"x-orch-token": TOKEN}
    ours = {"origin": f"http://127.0.0.1:{PORT}", "sec-fetch-site": "same-origin"}
    assert judge("POST", "/api/action/kill/j1", {}, **header, **ours) is Verdict.ALLOW
    for origin in ("http://evil.example", f"http://127.0.0.1:{PORT + 1}", "null"):
        refused = judge("POST", "/api/action/kill/j1", {}, **header, origin=origin)
        assert refused is Verdict.FORBIDDEN, origin
    for site in ("cross-site", "same-site"):
        refused = judge("POST", "/api/action/kill/j1", {}, **header, **{"sec-fetch-site": site})
        assert refused is Verdict.FORBIDDEN, site


def test_reads_are_gets_only() -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        assert judge(method, "/api/jobs", {"token": TOKEN}) is Verdict.NOT_ALLOWED


def test_each_run_has_a_fresh_long_token() -> None:
    tokens = {new_token() for _ in range(20)}
    assert len(tokens) == 20
    assert all(len(t) >= 43 and t.replace("-", "").replace("_", "").isalnum() for t in tokens)
