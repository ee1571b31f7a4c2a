"""Kubernetes ServiceAccount (and other cluster) tokens, accepted through TokenReview.

A bearer token that is not the daemon's own is sent to the API server as a TokenReview
(lightkube's resource, `POST /apis/authentication.k8s.io/v1/tokenreviews`, with the daemon's
own ServiceAccount token); it passes when the API server authenticates it and its user name or
one of its groups is allowed. Answers are cached by the token's SHA-256 (never the token) for
``ttl_s``, refusals for a shorter time, so a burst of requests costs one review and a revoked
token stops working within the TTL. Every failure to get an answer is ReviewUnavailable, one
line (the API makes it a 503), whatever lightkube or the transport raised.
"""

import hashlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import httpx2
from lightkube import Client, KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.models.authentication_v1 import TokenReviewSpec, TokenReviewStatus
from lightkube.resources.authentication_v1 import TokenReview

from vgpu_hypervisor.daemon.api.token_review import Review, ReviewUnavailable

SERVICE_ACCOUNT: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
REVIEW_PATH: Final = "/apis/authentication.k8s.io/v1/tokenreviews"
_CACHE_MOST: Final = 4096  # past this many answers, the expired ones go


def in_cluster_url() -> str | None:
    """The API server's TokenReview URL from the variables the kubelet sets in every pod."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return None
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{port}{REVIEW_PATH}"


def server_of(url: str) -> str:
    """The API server's URL from the setting, which names the TokenReview endpoint (the
    path lightkube adds is taken off) or the server itself."""
    stripped = url.rstrip("/")
    return stripped.removesuffix(REVIEW_PATH) or stripped


def _client(server: str, credential: Path | None, ca_file: Path | None, timeout_s: float) -> Client:
    # The credential is read by lightkube at the first review and again on a 401, so a token
    # the kubelet rotated is picked up; without one the reviews go unauthenticated (as before).
    user = User(token_file=str(credential)) if credential and credential.is_file() else User()
    cluster = Cluster(
        server=server, certificate_auth=str(ca_file) if ca_file and ca_file.is_file() else None
    )
    config = KubeConfig.from_one(cluster=cluster, user=user)
    return Client(config, timeout=httpx2.Timeout(timeout_s))


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text or type(error).__name__


class TokenReviewer:
    """Checks bearer tokens against the API server; thread-safe (the API's TokenReviewer)."""

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
        """``url``: the TokenReview endpoint or the API server (--token-review-url)."""
        self.url = url
        self._allow = frozenset(allow)
        self._client = _client(server_of(url), credential, ca_file, timeout_s)
        self._ttl = (ttl_s, refusal_ttl_s)
        self._clock = clock
        self._cache: dict[str, tuple[float, Review]] = {}
        self._lock = threading.Lock()

    def cached(self, token: str) -> Review | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        with self._lock:
            cached = self._cache.get(key)
        return cached[1] if cached is not None and cached[0] > self._clock() else None

    def review(self, token: str) -> Review:
        known = self.cached(token)
        if known is not None:
            return known
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        answer = self._judge(self._ask(token))
        with self._lock:
            if len(self._cache) > _CACHE_MOST:  # a flood of distinct bad tokens stays bounded
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            self._cache[key] = (now + self._ttl[0 if answer.allowed else 1], answer)
        return answer

    def _ask(self, token: str) -> TokenReviewStatus | None:
        """The API server's verdict on ``token`` (None: it said nothing)."""
        try:
            answer = self._client.create(TokenReview(spec=TokenReviewSpec(token=token)))
        except httpx2.HTTPStatusError as error:  # lightkube's ApiError among them
            status = error.response.status_code
            raise ReviewUnavailable(f"TokenReview at {self.url}: HTTP {status}") from None
        except httpx2.HTTPError as error:  # refused, reset, timed out, a bad TLS peer
            raise ReviewUnavailable(f"TokenReview at {self.url}: {_one_line(error)}") from None
        except Exception as error:  # an answer lightkube cannot decode, a vanished credential
            raise ReviewUnavailable(
                f"TokenReview at {self.url}: not a TokenReview answer ({_one_line(error)})"
            ) from None
        return answer.status if isinstance(answer, TokenReview) else None

    def _judge(self, status: TokenReviewStatus | None) -> Review:
        if status is None or not status.authenticated:
            why = (status.error if status is not None else None) or (
                "the API server did not authenticate it"
            )
            return Review(False, False, why)
        user = status.user
        name = (user.username if user is not None else None) or ""
        groups = (user.groups if user is not None else None) or []
        if name in self._allow or self._allow.intersection(groups):
            return Review(True, True, name)
        return Review(True, False, f"{name} may not use this node's API (--token-review-allow)")

    def close(self) -> None:
        self._client.close()
