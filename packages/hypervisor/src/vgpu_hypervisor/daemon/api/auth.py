"""The API token: its file (created when absent), and the check that every change needs."""

import os
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from vgpu_hypervisor.daemon.api.token_review import ReviewUnavailable, TokenReviewer


def read_or_create_token(path: Path) -> str:
    """The API token in ``path``, created (mode 0600, folder included) when absent."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if token:
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
        return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd, temporary = tempfile.mkstemp(prefix=".token-", dir=path.parent)
    try:
        os.write(fd, (token + "\n").encode())
        os.close(fd)
        Path(temporary).replace(path)  # mkstemp made it 0600
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return token


def token_check(token: str, reviewer: TokenReviewer | None = None) -> Callable[..., None]:
    """A route dependency: 401 unless the request carries ``token`` as its bearer token, or
    (with a ``reviewer``) a cluster token the API server vouches for; 403 for a cluster user
    who is not allowed, 503 when the API server cannot answer."""
    bearer = HTTPBearer(
        auto_error=False,
        description="The token in the daemon's token file, or a Kubernetes token (TokenReview).",
    )

    def authorized(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> None:
        challenge = {"WWW-Authenticate": "Bearer"}
        if credentials is None:
            raise HTTPException(401, "this request needs the API token (Bearer)", challenge)
        given = credentials.credentials
        if secrets.compare_digest(given.encode(), token.encode()):
            return
        if reviewer is None:
            raise HTTPException(401, "wrong API token", challenge)
        try:
            review = reviewer.review(given)
        except ReviewUnavailable as error:
            raise HTTPException(503, str(error)) from None
        if not review.allowed:
            status = 403 if review.authenticated else 401
            raise HTTPException(status, f"token refused: {review.reason}", challenge)

    return authorized
