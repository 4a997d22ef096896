"""Who may use the page: the rules every request of `orch ui` passes first. Pure: a
request's method, path, query and headers in, a verdict out.

1. The server listens on 127.0.0.1 only; a request must also name it in its Host
   header (`127.0.0.1:PORT` or `localhost:PORT`), so that a web site that points a
   name of its own at 127.0.0.1 (DNS rebinding) is refused whatever else it sends.
2. Every request carries the token: `?token=` in its address, or the
   `X-Orch-Token` header. Without it, or with another: 403 and nothing else.
3. An action (kill, stack) is a POST, its token in the header (a page of another
   origin cannot set that header without the server's consent, which it never
   gives), and refused when the browser says it comes from another origin (its
   `Origin` or `Sec-Fetch-Site`). Any other request is a GET or HEAD.

Cookies are not used: a browser sends a cookie of 127.0.0.1 to every port of it,
so to any other user's server on this machine too.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

TOKEN_HEADER = "x-orch-token"
ACTION_PREFIX = "/api/action/"
READ_METHODS = frozenset({"GET", "HEAD"})
LOOPBACK_NAMES = ("127.0.0.1", "localhost")


def new_token() -> str:
    """A fresh token: 32 random bytes, URL-safe."""
    return secrets.token_urlsafe(32)


class Verdict(Enum):
    """What becomes of a request."""

    ALLOW = 200
    FORBIDDEN = 403  # no token, a wrong one, a foreign Host or Origin
    NOT_ALLOWED = 405  # a method that path does not take


@dataclass(frozen=True)
class Guard:
    """The rules of one server: its token and port.

    Args:
        token: the secret every request carries.
        port: the port the server listens on (in the Host and Origin it accepts).
    """

    token: str
    port: int

    def judge(
        self, method: str, path: str, query: Mapping[str, str], headers: Mapping[str, str]
    ) -> Verdict:
        """The verdict on one request; `headers` with lowercase names."""
        if not self._our_host(headers.get("host", "")):
            return Verdict.FORBIDDEN
        action = path.startswith(ACTION_PREFIX)
        given = headers.get(TOKEN_HEADER) if action else _first(query, headers)
        if given is None or not hmac.compare_digest(given.encode(), self.token.encode()):
            return Verdict.FORBIDDEN
        if action:
            if method != "POST":
                return Verdict.NOT_ALLOWED
            if not self.same_origin(headers):
                return Verdict.FORBIDDEN
            return Verdict.ALLOW
        return Verdict.ALLOW if method in READ_METHODS else Verdict.NOT_ALLOWED

    def same_origin(self, headers: Mapping[str, str]) -> bool:
        """Whether the browser, where it says, says the request comes from this page:
        an `Origin` of this server, and a `Sec-Fetch-Site` of `same-origin` (a client
        that is no browser, curl say, sends neither)."""
        origin = headers.get("origin")
        if origin is not None and origin not in self.origins:
            return False
        site = headers.get("sec-fetch-site")
        return site is None or site in ("same-origin", "none")

    @property
    def origins(self) -> tuple[str, ...]:
        return tuple(f"http://{name}:{self.port}" for name in LOOPBACK_NAMES)

    def _our_host(self, host: str) -> bool:
        return host in (f"{name}:{self.port}" for name in LOOPBACK_NAMES)


def _first(query: Mapping[str, str], headers: Mapping[str, str]) -> str | None:
    token = query.get("token")
    return token if token is not None else headers.get(TOKEN_HEADER)
