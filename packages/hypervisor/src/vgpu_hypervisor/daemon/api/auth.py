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


def token_check(token: str) -> Callable[..., None]:
    """A route dependency: 401 unless the request carries ``token`` as its bearer token."""
    bearer = HTTPBearer(auto_error=False, description="The token in the daemon's token file.")

    def authorized(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> None:
        challenge = {"WWW-Authenticate": "Bearer"}
        if credentials is None:
            raise HTTPException(401, "this request needs the API token (Bearer)", challenge)
        if not secrets.compare_digest(credentials.credentials.encode(), token.encode()):
            raise HTTPException(401, "wrong API token", challenge)

    return authorized
