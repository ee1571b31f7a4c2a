"""The API token: its file (created when absent), and what needs it: every change, and every
read the api_open_reads setting does not open."""

import asyncio
import os
import secrets
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Final

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from vgpu_common.small_file import TOKEN_LIMIT, SmallFileError, read_small_file, token_of

from vgpu_hypervisor.daemon.api.token_review import ReviewUnavailable, TokenReviewer
from vgpu_hypervisor.settings import API_READ_AREAS


def read_or_create_token(path: Path) -> str:
    """The API token in ``path``, created (mode 0600, folder included) when absent or empty;
    SmallFileError when the file holds something else than a token (or is no regular file)."""
    try:
        token = token_of(read_small_file(path, TOKEN_LIMIT))
    except FileNotFoundError:
        token = ""
    except SmallFileError as error:
        if str(error) != "empty":
            raise
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


# The reads api_open_reads may open are settings.API_READ_AREAS. /healthz, /readyz and
# /openapi.json are always open: they are the probes' and carry no pod's data.

# TokenReview calls under way at once; past them a cluster token gets 503 at once rather than
# a queue (a flood of made-up tokens would otherwise hold every connection it has for seconds).
MAX_REVIEWS: Final = 8
_CHALLENGE: Final = {"WWW-Authenticate": "Bearer"}


@dataclass(frozen=True)
class Caller:
    """Who asks: ``authenticated`` when the request carries a token the daemon accepts."""

    authenticated: bool


class Access:
    """The API's route dependencies: ``change()`` for requests that change the node (the
    token, always) and ``read(area)`` for reads (the token, unless ``open_reads`` opens the
    area). A token that is given is always checked: a wrong one is a 401 even where reads are
    open, so a mistyped token file is not mistaken for an anonymous read."""

    def __init__(
        self,
        token: str,
        reviewer: TokenReviewer | None = None,
        open_reads: Iterable[str] = (),
    ) -> None:
        self._token = token.encode()
        self._reviewer = reviewer
        self.open_reads = frozenset(open_reads)
        unknown = self.open_reads.difference(API_READ_AREAS)
        if unknown:
            raise ValueError(f"no such read area: {', '.join(sorted(unknown))}")
        self._bearer = HTTPBearer(
            auto_error=False,
            description="The token in the daemon's token file, or a Kubernetes token "
            "(TokenReview).",
        )
        self._reviews = asyncio.Semaphore(MAX_REVIEWS)

    async def _given(self, request: Request) -> HTTPAuthorizationCredentials | None:
        """The request's Bearer token; None when it has no Authorization header. Two headers
        (only the first was checked) are a 400, and one that is not a Bearer token a 401: a
        token given is always checked, never taken for an anonymous read."""
        given = request.headers.getlist("authorization")
        if len(given) > 1:
            raise HTTPException(400, "more than one Authorization header")
        credentials = await self._bearer(request)
        if given and credentials is None:
            raise HTTPException(401, "expected Authorization: Bearer TOKEN", _CHALLENGE)
        return credentials

    def change(self) -> Callable[..., Awaitable[Caller]]:
        """A dependency: 401 unless the request carries an accepted token."""

        async def authorized(
            credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(self._given)],
        ) -> Caller:
            if credentials is None:
                raise HTTPException(401, "this request needs the API token (Bearer)", _CHALLENGE)
            await self._verify(credentials.credentials)
            return Caller(authenticated=True)

        return authorized

    def read(self, area: str) -> Callable[..., Awaitable[Caller]]:
        """A dependency for a read of ``area``: without a token, 401 unless the area is open."""
        if area not in API_READ_AREAS:
            raise ValueError(f"no such read area: {area}")
        is_open = area in self.open_reads

        async def reader(
            credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(self._given)],
        ) -> Caller:
            if credentials is None:
                if is_open:
                    return Caller(authenticated=False)
                raise HTTPException(
                    401,
                    "this request needs the API token (Bearer); the daemon's api_open_reads "
                    f"setting can open {area} reads without one",
                    _CHALLENGE,
                )
            await self._verify(credentials.credentials)
            return Caller(authenticated=True)

        return reader

    async def _verify(self, given: str) -> None:
        """Return when ``given`` is accepted; 401, 403 or 503 otherwise."""
        # The token file's token is checked here on the event loop, never behind the
        # TokenReview calls, so the admin is answered whatever cluster tokens others send.
        if secrets.compare_digest(given.encode(), self._token):
            return
        reviewer = self._reviewer
        if reviewer is None:
            raise HTTPException(401, "wrong API token", _CHALLENGE)
        review = reviewer.cached(given)
        if review is None:
            if self._reviews.locked():
                raise HTTPException(503, "too many TokenReview calls under way; try again")
            async with self._reviews:
                try:
                    review = await run_in_threadpool(reviewer.review, given)
                except ReviewUnavailable as error:
                    raise HTTPException(503, str(error)) from None
        if not review.allowed:
            status = 403 if review.authenticated else 401
            raise HTTPException(status, f"token refused: {review.reason}", _CHALLENGE)
