"""Request bodies in Kubernetes' protobuf encoding, read as the JSON object they stand for.

Typed clients send built-in kinds as ``application/vnd.kubernetes.protobuf`` (``kubectl create
namespace`` does, whatever the server answers in): four magic bytes ``k8s\\0``, then a
``runtime.Unknown`` whose ``typeMeta`` names the kind and whose ``raw`` is the object's message.
The messages are those of the published ``generated.proto`` files of k8s.io/api and
k8s.io/apimachinery v0.34.10 (``third_party/proto/``, their comments removed), compiled on
first use.

The object is turned into what its JSON encoding says: Go writes every non-pointer field on the
wire, so empty strings, empty lists and maps and zero times are left out (decoded as Go decodes
them, they are the field's zero value either way); numbers, booleans and nested objects stay as
sent (a pointer field set to zero or to an empty object means what it says), but for the
metadata's, which only the server sets.
"""

from __future__ import annotations

import base64
import functools
import json
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from tests.support.apiserver.errors import ApiError

CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"
_FOLDER = Path(__file__).parent / "third_party" / "proto"
_META = "k8s.io.apimachinery.pkg.apis.meta.v1."


@functools.cache
def _pool() -> descriptor_pool.DescriptorPool:
    from grpc_tools import protoc

    files = sorted(str(p.relative_to(_FOLDER)) for p in _FOLDER.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "descriptors.pb"
        code = protoc.main(
            ["protoc", f"-I{_FOLDER}", f"--descriptor_set_out={out}", "--include_imports", *files]
        )
        if code != 0:
            raise RuntimeError(f"protoc could not compile {_FOLDER} ({code})")
        descriptors = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in descriptors.file:
        pool.Add(file)
    return pool


def _message(full_name: str) -> Message | None:
    try:
        descriptor = _pool().FindMessageTypeByName(full_name)
    except KeyError:
        return None
    made: Message = message_factory.GetMessageClass(descriptor)()
    return made


def package(api_version: str) -> str:
    """The proto package of a group version: ``apps/v1`` is ``k8s.io.api.apps.v1``, ``v1`` the
    core group's ``k8s.io.api.core.v1``, ``rbac.authorization.k8s.io/v1`` ``…rbac.v1``."""
    group, _, version = api_version.rpartition("/")
    return f"k8s.io.api.{group.split('.')[0] or 'core'}.{version}"


def decode(body: bytes) -> dict[str, Any]:
    """The object a protobuf request body carries, as JSON would have it (with its kind and
    apiVersion); 400 BadRequest for a body that is not one, 415 for a kind without a message."""
    if not body.startswith(MAGIC):
        raise ApiError(400, "BadRequest", "the protobuf body does not start with k8s\\x00")
    envelope = _message("k8s.io.apimachinery.pkg.runtime.Unknown")
    assert envelope is not None
    try:
        envelope.ParseFromString(body[len(MAGIC) :])
    except DecodeError as error:
        raise ApiError(400, "BadRequest", f"the protobuf body does not decode: {error}") from None
    type_meta: Any = getattr(envelope, "typeMeta")  # noqa: B009 (a generated message's field)
    api_version, kind = type_meta.apiVersion, type_meta.kind
    obj = _message(f"{package(api_version)}.{kind}") or _message(_META + kind)  # options
    if obj is None:
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"no protobuf message is known for {api_version} {kind}; send application/json",
        )
    try:
        obj.ParseFromString(getattr(envelope, "raw"))  # noqa: B009
    except DecodeError as error:
        raise ApiError(400, "BadRequest", f"the {kind} does not decode: {error}") from None
    document = _object(obj)
    document["apiVersion"], document["kind"] = api_version, kind
    return document


def _object(message: Message) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for field, value in message.ListFields():
        converted = _field(field, value)
        several = field.is_repeated  # maps among them
        if converted is None or converted == "" or (several and not converted):
            continue
        if converted == 0 and message.DESCRIPTOR.full_name == _META + "ObjectMeta":
            continue  # its numbers are the server's (generation) or pointers set only by it
        document[field.name] = converted
    return document


def _field(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value_field = field.message_type.fields_by_name["value"]
        return {k: _single(value_field, v) for k, v in value.items()}
    if field.is_repeated:
        return [_single(field, v) for v in value]
    return _single(field, value)


def _single(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode()
    if field.message_type is None:
        return value
    return _special(field.message_type, value)


def _time(value: Any, micro: bool) -> str | None:
    if not value.seconds and not value.nanos:
        return None  # the zero time is null in JSON
    moment = datetime.fromtimestamp(value.seconds + value.nanos / 1e9, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def _raw_json(raw: bytes) -> Any:
    return json.loads(raw) if raw else None


# The JSON of the types that marshal themselves: times, quantities, int-or-string, raw JSON.
_SPECIAL: dict[str, Callable[[Any], Any]] = {
    _META + "Time": lambda v: _time(v, micro=False),
    _META + "MicroTime": lambda v: _time(v, micro=True),
    _META + "Duration": lambda v: f"{v.duration / 1e9:g}s",
    _META + "FieldsV1": lambda v: _raw_json(v.Raw),
    "k8s.io.apimachinery.pkg.runtime.RawExtension": lambda v: _raw_json(v.raw),
    "k8s.io.apimachinery.pkg.api.resource.Quantity": lambda v: v.string or None,
    "k8s.io.apimachinery.pkg.api.resource.QuantityValue": lambda v: v.string or None,
    "k8s.io.apimachinery.pkg.util.intstr.IntOrString": lambda v: v.strVal if v.type else v.intVal,
}


def _special(descriptor: Descriptor, value: Any) -> Any:
    convert = _SPECIAL.get(descriptor.full_name)
    return _object(value) if convert is None else convert(value)
