"""`--owner USER[:GROUP]` of `pods create`: names or ids, resolved on this node."""

import grp
import pwd

from vgpu_common.cli import fail

LARGEST_ID = 0xFFFFFFFE  # (uid_t)-1 means "no change" to chown


def _id(kind: str, text: str) -> int:
    if text.isascii() and text.isdigit():
        number = int(text)
        if number > LARGEST_ID:
            fail(f"--owner: {kind} id {text} is past the largest, {LARGEST_ID}")
        return number
    try:
        return pwd.getpwnam(text).pw_uid if kind == "user" else grp.getgrnam(text).gr_gid
    except KeyError:
        fail(f"--owner: no {kind} {text!r} on this node")


def pod_owner(value: str) -> dict[str, int]:
    """The API's owner/group fields from USER, USER:GROUP or :GROUP."""
    user, _, group = value.partition(":")
    if not user and not group:
        fail(f"--owner {value!r}: expected USER, USER:GROUP or :GROUP")
    fields: dict[str, int] = {}
    if user:
        fields["owner"] = _id("user", user)
    if group:
        fields["group"] = _id("group", group)
    return fields
