"""What the API asks of a token reviewer: whether a bearer token that is not the daemon's own
may use the API.

The one reviewer is Kubernetes' TokenReview (kubernetes/token_review.py, through lightkube),
which the daemon's wiring hands in when --token-review is on; the API knows it only through
this protocol, so a bare daemon loads no Kubernetes client.
"""

from dataclasses import dataclass
from typing import Protocol


class ReviewUnavailable(Exception):
    """The reviewer could not answer (its server away, a bad answer); one line."""


@dataclass(frozen=True)
class Review:
    authenticated: bool  # the cluster knows the token
    allowed: bool  # and its user or a group is allowed
    reason: str  # the user when allowed, else why not


class TokenReviewer(Protocol):
    """Thread-safe: ``review`` runs in the API's worker threads, several at once."""

    def cached(self, token: str) -> Review | None:
        """The answer for ``token`` while it is cached, else None; never asks the server."""

    def review(self, token: str) -> Review:
        """Whether ``token`` may use the API; ReviewUnavailable when the server cannot say."""

    def close(self) -> None: ...
