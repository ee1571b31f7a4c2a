"""Kubernetes ServiceAccount (and other cluster) tokens, accepted through TokenReview.

A bearer token that is not the daemon's own is sent to the API server
(`POST /apis/authentication.k8s.io/v1/tokenreviews`, with the daemon's own ServiceAccount
token); it passes when the API server authenticates it and its user name or one of its groups
is allowed. Answers are cached by the token's SHA-256 (never the token) for ``ttl_s``, refusals
for a shorter time, so a burst of requests costs one review and a revoked token stops working
within the TTL.
"""

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import httpx

SERVICE_ACCOUNT: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
REVIEW_PATH: Final = "/apis/authentication.k8s.io/v1/tokenreviews"


class ReviewUnavailable(Exception):
    """The API server could not answer; one line."""


@dataclass(frozen=True)
class Review:
    authenticated: bool  # the API server knows the token
    allowed: bool  # and its user or a group is allowed
    reason: str  # the user when allowed, else why not


def in_cluster_url() -> str | None:
    """The API server's TokenReview URL from the variables the kubelet sets in every pod."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return None
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{port}{REVIEW_PATH}"


class TokenReviewer:
    """Checks bearer tokens against the API server; thread-safe."""

    def __init__(
        self,
        url: str,
        allow: Sequence[str],
        *,
        credential: Path | None = SERVICE_ACCOUNT / "token",
        ca_file: Path | None = SERVICE_ACCOUNT / "ca.crt",
        ttl_s: float = 60.0,
        refusal_ttl_s: float = 10.0,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self._allow = frozenset(allow)
        self._credential = credential
        verify: str | bool = str(ca_file) if ca_file is not None and ca_file.is_file() else True
        self._http = httpx.Client(timeout=timeout_s, verify=verify)
        self._ttl = (ttl_s, refusal_ttl_s)
        self._clock = clock
        self._cache: dict[str, tuple[float, Review]] = {}
        self._lock = threading.Lock()

    def cached(self, token: str) -> Review | None:
        """The answer for ``token`` while it is cached, else None; never calls the server."""
        key = hashlib.sha256(token.encode()).hexdigest()
        with self._lock:
            cached = self._cache.get(key)
        return cached[1] if cached is not None and cached[0] > self._clock() else None

    def review(self, token: str) -> Review:
        """Whether ``token`` may use the API; ReviewUnavailable when the server cannot say."""
        known = self.cached(token)
        if known is not None:
            return known
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        answer = self._ask(token)
        with self._lock:
            if len(self._cache) > 4096:  # a flood of distinct bad tokens stays bounded
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            self._cache[key] = (now + self._ttl[0 if answer.allowed else 1], answer)
        return answer

    def _ask(self, token: str) -> Review:
        headers = {}
        if self._credential is not None and self._credential.is_file():
            headers["Authorization"] = f"Bearer {self._credential.read_text().strip()}"
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        try:
            response = self._http.post(self.url, json=body, headers=headers)
        except httpx.HTTPError as error:
            raise ReviewUnavailable(f"TokenReview at {self.url}: {error}") from None
        if response.status_code not in {200, 201}:
            raise ReviewUnavailable(f"TokenReview at {self.url}: HTTP {response.status_code}")
        try:
            status = response.json().get("status") or {}
            user = status.get("user") or {}
            name = str(user.get("username", ""))
            groups = [str(group) for group in user.get("groups") or []]
        except (json.JSONDecodeError, AttributeError):
            raise ReviewUnavailable(f"TokenReview at {self.url}: not a TokenReview") from None
        if not status.get("authenticated"):
            why = status.get("error") or "the API server did not authenticate it"
            return Review(False, False, str(why))
        if name in self._allow or self._allow.intersection(groups):
            return Review(True, True, name)
        return Review(True, False, f"{name} may not use this node's API (--token-review-allow)")

    def close(self) -> None:
        self._http.close()
