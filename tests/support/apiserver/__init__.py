"""A Kubernetes API server for tests that real clients drive: kubectl, the official Python
client, lightkube (the daemon's). Discovery, OpenAPI v3, namespaced and cluster-scoped kinds
from a table (kinds.py), create/get/list/watch/update/patch/delete with resourceVersion,
selectors, paged lists, bookmarks and graceful deletion, server-side apply with managedFields
(apply.py), the status subresource, tables for kubectl's printing, bodies in JSON, YAML or
protobuf (protobuf.py); every object checked against Kubernetes' published schemas
(schemas.py)."""

from tests.support.apiserver.errors import ApiError
from tests.support.apiserver.kinds import Kind
from tests.support.apiserver.server import ApiServer

__all__ = ["ApiError", "ApiServer", "Kind"]
