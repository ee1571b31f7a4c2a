"""Every package's metadata is complete and consistent (docs/release.md, "Package metadata")."""

import tomllib
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(path.parent for path in (ROOT / "packages").glob("*/pyproject.toml"))
# The labels PyPI shows with an icon; anything else is still shown, but these are what users
# look for.
KNOWN_URL_LABELS = {"Homepage", "Documentation", "Repository", "Issues", "Changelog", "Source"}


def project(package: Path) -> dict[str, object]:
    data: dict[str, object] = tomllib.loads((package / "pyproject.toml").read_text())["project"]
    return data


def test_every_package_is_found() -> None:
    assert [p.name for p in PACKAGES] == ["add_path", "common", "hypervisor", "limiter"]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_metadata_is_complete(package: Path) -> None:
    meta = project(package)
    assert str(meta["name"]).startswith("vgpu-")
    assert meta["description"] and len(str(meta["description"])) <= 120
    assert (package / str(meta["readme"])).is_file()
    assert meta["license"] == "Apache-2.0"
    assert all((package / name).is_file() for name in meta["license-files"])  # type: ignore[attr-defined]
    assert meta["requires-python"] == ">=3.11"
    classifiers = set(meta["classifiers"])  # type: ignore[call-overload]
    for needed in (
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Development Status :: 3 - Alpha",
    ):
        assert needed in classifiers, f"{package.name}: classifier {needed!r} missing"
    if package.name in ("limiter", "hypervisor"):  # the two that deal with GPUs
        assert "Environment :: GPU :: NVIDIA CUDA" in classifiers
    # License classifiers are deprecated beside an SPDX license expression (PEP 639).
    assert not any(c.startswith("License ::") for c in classifiers)


def test_versions_agree() -> None:
    versions = {project(p)["version"] for p in PACKAGES}
    assert len(versions) == 1, versions


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_project_urls_when_given_are_https(package: Path) -> None:
    """The project has no public home yet, so no package lists URLs (docs/release.md says why);
    once they do, each must be an https address under a label users look for."""
    urls = project(package).get("urls", {})
    assert isinstance(urls, dict)
    for label, url in urls.items():
        assert label in KNOWN_URL_LABELS, f"{package.name}: URL label {label!r}"
        parsed = urlparse(url)
        assert parsed.scheme == "https" and parsed.netloc, f"{package.name}: {label} = {url!r}"
