"""The dashboard's login cookie and CSRF tokens: HMAC-SHA256 over the tenant name, the role (a tenant's
key, or the admin key, whose session names the tenant it is looking at) and an expiry, with a secret
from `server.dashboard_secret` (or one drawn per process: sessions then end with it)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

COOKIE = "cg_session"
LIFETIME_SECONDS = 8 * 3600


@dataclass(frozen=True, slots=True)
class Session:
    tenant: str
    admin: bool  # signed in with `server.admin_key`: may switch to any tenant


class Sessions:
    def __init__(self, secret: str | None) -> None:
        self._key = (secret or secrets.token_hex(32)).encode()

    def _sign(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def issue(self, tenant: str, now: float | None = None, *, admin: bool = False) -> str:
        expires = int((now if now is not None else time.time()) + LIFETIME_SECONDS)
        role = "a" if admin else "t"
        body = f"{base64.urlsafe_b64encode(tenant.encode()).decode()}.{role}.{expires}"
        return f"{body}.{self._sign(body)}"

    def session(self, cookie: str | None, now: float | None = None) -> Session | None:
        """Whom a cookie was issued to, or None (missing, forged, expired)."""
        if not cookie or cookie.count(".") != 3:
            return None
        encoded, role, expires, signature = cookie.split(".")
        if not hmac.compare_digest(signature, self._sign(f"{encoded}.{role}.{expires}")):
            return None
        if not expires.isdigit() or int(expires) < (now if now is not None else time.time()):
            return None
        try:
            return Session(base64.urlsafe_b64decode(encoded.encode()).decode(), admin=role == "a")
        except ValueError:
            return None

    def tenant(self, cookie: str | None, now: float | None = None) -> str | None:
        """The tenant a cookie was issued for (or, for the admin, is looking at), or None."""
        found = self.session(cookie, now)
        return found.tenant if found is not None else None

    def csrf(self, cookie: str) -> str:
        """The token every form of this session carries (tied to the cookie, so it cannot be reused)."""
        return self._sign(f"csrf:{cookie}")[:40]

    def csrf_ok(self, cookie: str | None, token: str | None) -> bool:
        return bool(cookie and token) and hmac.compare_digest(self.csrf(cookie or ""), token or "")
