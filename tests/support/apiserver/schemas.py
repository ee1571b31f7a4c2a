"""Kubernetes' published schemas (shipped by kubernetes-validate, so offline): the checks of
created and updated objects, the merge keys of strategic merge patches, and the OpenAPI v3
documents clients download (kubectl asks whether a kind takes ``fieldValidation``)."""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # kubernetes-validate's, without types
import kubernetes_validate

from tests.support.apiserver.errors import ApiError
from tests.support.apiserver.kinds import Kind

Object = dict[str, Any]


def _schema_folder(version: str) -> str:
    """The newest schema folder not newer than ``version`` (as kubernetes-validate picks)."""
    wanted = tuple(int(p) for p in version.split(".")[:2])
    shipped = sorted(
        tuple(int(p) for p in m.groups())
        for entry in resources.files("kubernetes_validate")
        .joinpath("kubernetes-json-schema")
        .iterdir()
        if (m := re.fullmatch(r"v(\d+)\.(\d+)\.\d+-local-strict", entry.name))
    )
    usable = [v for v in shipped if v <= wanted]
    if not usable:
        raise ValueError(f"kubernetes-validate ships no schema for Kubernetes {version}")
    major, minor = usable[-1]
    return f"v{major}.{minor}.0-local-strict"


@functools.cache
def definitions(version: str) -> dict[str, Object]:
    folder = resources.files("kubernetes_validate").joinpath(
        "kubernetes-json-schema", _schema_folder(version), "_definitions.json"
    )
    found: dict[str, Object] = json.loads(folder.read_text())["$defs"]
    return found


class Schemas:
    """The schemas of one Kubernetes version."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.defs = definitions(version)
        self._by_kind: dict[tuple[str, str, str], str] = {}
        for name, node in self.defs.items():
            for gvk in node.get("x-kubernetes-group-version-kind", []):
                self._by_kind[(gvk["group"], gvk["version"], gvk["kind"])] = name

    def definition(self, kind: Kind) -> str | None:
        return self._by_kind.get((kind.group, kind.version, kind.kind))

    def resolve(self, node: Object) -> Object:
        while "$ref" in node:
            node = self.defs[node["$ref"].rsplit("/", 1)[-1]]
        return node

    def root(self, kind: Kind) -> Object | None:
        name = self.definition(kind)
        return None if name is None else self.defs[name]

    def decode(self, kind: Kind, obj: Any) -> None:
        """Check what decoding checks upstream, before anything reads the object: that it is
        an object of the URL's kind whose every field has its type (400 BadRequest: ``x in
        version "v1" cannot be handled as a X``); the rest of the schema is ``validate``'s."""
        what = f'{kind.kind} in version "{kind.version}" cannot be handled as a {kind.kind}'
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", f"{what}: the body is not an object")
        for field, expected in (("apiVersion", kind.group_version), ("kind", kind.kind)):
            if obj.get(field) not in (None, expected):
                raise ApiError(
                    400,
                    "BadRequest",
                    f"{what}: the object's {field} is {obj[field]!r}, not {expected!r}",
                )
        name = self.definition(kind)
        if name is None:
            return
        error = next((e for e in _types(self.version, name).iter_errors(obj)
                      if e.validator == "type"), None)  # fmt: skip
        if error is not None:
            raise ApiError(400, "BadRequest", f"{what}: {_where(error)}: {error.message}")

    def validate(self, obj: Object, *, strict: bool) -> list[str]:
        """Check ``obj``; raises 422 Invalid for an error of the schema, 400 for an unknown
        field when ``strict``, and gives the unknown fields' warnings otherwise."""
        name = obj.get("metadata", {}).get("name", "")
        what = f'{obj.get("kind")} "{name}"'
        try:
            kubernetes_validate.validate(obj, self.version, strict=False)
        except kubernetes_validate.ValidationError as error:
            field = _where(error)
            required = error.validator == "required"
            cause = {
                "reason": "FieldValueRequired" if required else "FieldValueInvalid",
                "message": "Required value" if required else error.message,
                "field": field,
            }
            raise ApiError(
                422,
                "Invalid",
                f"{what} is invalid: {field}: {cause['message']}",
                {"name": name, "kind": obj.get("kind"), "causes": [cause]},
            ) from None
        try:
            kubernetes_validate.validate(obj, self.version, strict=True)
        except kubernetes_validate.ValidationError as error:
            unknown = (
                f'unknown field "{_where(error)}"'
                if error.validator == "additionalProperties"
                else error.message
            )
            if strict:
                raise ApiError(400, "BadRequest", f"strict decoding error: {unknown}") from None
            return [unknown]
        return []

    def openapi(self, kinds: list[Kind], group_version: str) -> Object:
        """The OpenAPI v3 document of one group version: its kinds' paths (each operation
        naming its kind and the query parameters it takes) and every schema."""
        parameters = [
            {"name": n, "in": "query", "schema": {"type": "string"}}
            for n in ("dryRun", "fieldManager", "fieldValidation")
        ]
        prefix = "/api/" if group_version == "v1" else "/apis/"
        paths: Object = {}
        for kind in kinds:
            gvk = {"group": kind.group, "version": kind.version, "kind": kind.kind}
            ref = self.definition(kind)
            body = {
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}
            }
            operation = {
                "x-kubernetes-group-version-kind": gvk,
                "parameters": parameters,
                "responses": {"200": body},
            }
            scope = "namespaces/{namespace}/" if kind.namespaced else ""
            base = f"{prefix}{group_version}/{scope}{kind.plural}"
            paths[base] = {"get": operation, "post": operation}
            paths[base + "/{name}"] = {
                verb: operation for verb in ("get", "put", "patch", "delete")
            }
        text = json.dumps(self.defs).replace('"#/$defs/', '"#/components/schemas/')
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": f"v{self.version}"},
            "paths": paths,
            "components": {"schemas": json.loads(text)},
        }


@functools.cache
def _types(version: str, name: str) -> Any:
    """A validator of one definition (of which ``decode`` takes the type errors)."""
    return jsonschema.Draft202012Validator(
        {"$defs": definitions(version), "$ref": f"#/$defs/{name}"}
    )


def _where(error: Any) -> str:
    """The field of a schema error in Kubernetes' notation: spec.containers[0].name."""
    path = ""
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    if error.validator == "additionalProperties":
        extra = re.findall(r"'([^']+)' (?:was|were) unexpected", error.message)
        if not extra:
            extra = re.findall(r"\('([^']+)'", error.message)
        if extra:
            path += f".{extra[0]}"
    elif error.validator == "required":
        missing = re.findall(r"'([^']+)' is a required property", error.message)
        if missing:
            path += f".{missing[0]}"
    return path.lstrip(".") or "<object>"
