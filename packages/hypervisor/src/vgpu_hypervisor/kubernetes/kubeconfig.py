"""The client configuration of the API server, found and merged as kubectl does.

`--kubeconfig` / `KUBECONFIG` may name several files, separated as `PATH` is (`a:b`): kubectl
merges them, the first file to name a cluster, user or context or to set `current-context`
winning, files that do not exist skipped. Operators set such lists on their own machines and
expect every Kubernetes client to read them alike. lightkube reads one file, and a file whose
YAML is not a kubeconfig's shape came out of it as a traceback (`'list' object has no attribute
'get'`): each file is checked here and said wrong in one line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import yaml

if TYPE_CHECKING:
    from lightkube import KubeConfig

DEFAULT_FILE: Final = "~/.kube/config"
# Each section's entries: its own key, and the paths in them that are relative to their file.
_SECTIONS: Final = {
    "clusters": ("cluster", ("certificate-authority",)),
    "users": ("user", ("client-certificate", "client-key", "tokenFile")),
    "contexts": ("context", ()),
}


class KubeConfigError(Exception):
    """The client configuration cannot be read; one line naming what is wrong."""


def load(where: str | Path | None) -> KubeConfig:
    """The configuration of `where` (a file, or files separated as PATH is); where None, the
    pod's service account, else ~/.kube/config. KubeConfigError says why it cannot be read."""
    from lightkube import KubeConfig
    from lightkube.core.exceptions import ConfigError

    if where is None:
        try:
            return KubeConfig.from_service_account()
        except (ConfigError, KeyError, OSError):  # not in a pod (KeyError: no KUBERNETES_SERVICE_*)
            where = DEFAULT_FILE
    files = [Path(part).expanduser().absolute() for part in str(where).split(os.pathsep) if part]
    if not files:
        raise KubeConfigError("no kubeconfig file named")
    try:
        config = KubeConfig.from_dict(_merge(files), fname=files[0])
        config.get()  # its current context is one of its own: said here, with the files named
        return config
    except KubeConfigError:
        raise
    except (ConfigError, OSError, ValueError, KeyError, TypeError) as error:
        message = " ".join(str(error).split()) or type(error).__name__
        if isinstance(error, KeyError):
            message = f"no {message} in it"
        raise KubeConfigError(", ".join(map(str, files)) + ": " + message) from None


def _merge(files: list[Path]) -> dict[str, Any]:
    """One configuration of `files`, kubectl's way; files missing from a list of several are
    skipped (a list's missing file is a default, not a mistake), a single one is not."""
    merged: dict[str, Any] = {"clusters": [], "users": [], "contexts": []}
    named: dict[str, set[str]] = {section: set() for section in _SECTIONS}
    read = 0
    for path in files:
        if path.is_dir():
            raise KubeConfigError(f"{path} is a folder")
        if not path.exists() and len(files) > 1:
            continue
        document = _read(path)
        read += 1
        if merged.get("current-context") is None and document.get("current-context"):
            merged["current-context"] = document["current-context"]
        for section, (key, paths) in _SECTIONS.items():
            for entry in _entries(path, document, section, key):
                if entry["name"] not in named[section]:
                    named[section].add(entry["name"])
                    merged[section].append(_absolute(path, entry, key, paths))
    if read == 0:
        raise KubeConfigError("none of " + ", ".join(map(str, files)) + " exists")
    return merged


def _read(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KubeConfigError(f"{path} not found") from None
    except UnicodeDecodeError:
        raise KubeConfigError(f"{path} is not UTF-8 text") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or "malformed"
        raise KubeConfigError(f"{path} is not YAML{where}: {problem}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise KubeConfigError(f"{path} is not a kubeconfig: a {type(document).__name__}")
    return document


def _entries(path: Path, document: Mapping[str, Any], section: str, key: str) -> list[Any]:
    entries = document.get(section)
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise KubeConfigError(f"{path}: {section} is not a list")
    for entry in entries:
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("name"), str)
            or not isinstance(entry.get(key), dict)
        ):
            raise KubeConfigError(f"{path}: each of {section} needs a name and a {key} mapping")
    return entries


def _absolute(path: Path, entry: dict[str, Any], key: str, paths: tuple[str, ...]) -> Any:
    """`entry` with its file paths relative to `path`'s folder made absolute, as kubectl
    resolves them: merged, they would otherwise be taken relative to the first file."""
    body = dict(entry[key])
    for field in paths:
        value = body.get(field)
        if isinstance(value, str) and value and not Path(value).is_absolute():
            body[field] = str(path.parent / value)
    return {**entry, key: body}
