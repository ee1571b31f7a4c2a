"""The daemon's layers, read from the imports of every module of vgpu_hypervisor.

From the bottom: the base (settings, models, the GPU layer), the core (daemon/: the store, the
node's passes, the scheduling policy, the API), Kubernetes (kubernetes/), the device plugin
(device_plugin/: it reads Kubernetes' pods), the DRA driver (dra/: it gives containers what the
device plugin's Allocate gives), the one module that wires them into the daemon
(daemon/service.py), the front (the CLI and its client). A module imports from its own layer or
below, never above, lazily or not; only the adapters and the wiring module import the adapters,
and only the adapters import the kubernetes extra's packages, so a bare daemon never loads them.
"""

import ast
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import vgpu_hypervisor
from vgpu_hypervisor.extras import KUBERNETES_MODULES

from tests.hypervisor.conftest import Daemon

PACKAGE = "vgpu_hypervisor"
SOURCE = Path(vgpu_hypervisor.__file__).parent
WIRING = "vgpu_hypervisor.daemon.service"
ADAPTERS = ("vgpu_hypervisor.kubernetes", "vgpu_hypervisor.device_plugin", "vgpu_hypervisor.dra")
# Lowest first; a module belongs to the layer of its longest prefix here.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            PACKAGE,  # its __init__ alone: the package's version
            "vgpu_hypervisor.extras",
            "vgpu_hypervisor.gpu",
            "vgpu_hypervisor.listen_address",
            "vgpu_hypervisor.models",
            "vgpu_hypervisor.settings",
        ),
    ),
    ("core", ("vgpu_hypervisor.daemon",)),
    ("kubernetes", ("vgpu_hypervisor.kubernetes",)),
    ("device plugin", ("vgpu_hypervisor.device_plugin",)),
    ("dra", ("vgpu_hypervisor.dra",)),
    ("wiring", (WIRING,)),
    (
        "front",
        (
            "vgpu_hypervisor.__main__",
            "vgpu_hypervisor.cli",
            "vgpu_hypervisor.client",
            "vgpu_hypervisor.settings_cli",
        ),
    ),
)


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the module imported (a package's module where `from P import m` names one)
    line: int
    lazy: bool  # in a function or under TYPE_CHECKING: not run when the module loads


def _module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(SOURCE.rglob("*.py"))}


class _Imports(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.found: list[Import] = []
        self._lazy = 0

    def _add(self, target: str, node: ast.stmt) -> None:
        self.found.append(Import(self.module, target, node.lineno, self._lazy > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:  # relative: from the importing module's package up
            anchor = self.package.split(".")[: len(self.package.split(".")) - node.level + 1]
            base = ".".join([*anchor, *([base] if base else [])])
        for alias in node.names:
            named = f"{base}.{alias.name}"
            self._add(named if named in modules() else base, node)

    def _deferred(self, node: ast.AST) -> None:
        self._lazy += 1
        self.generic_visit(node)
        self._lazy -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = _deferred

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        if name != "TYPE_CHECKING":
            self.generic_visit(node)
            return
        self._lazy += 1
        for statement in node.body:
            self.visit(statement)
        self._lazy -= 1
        for statement in node.orelse:
            self.visit(statement)


@cache
def imports() -> tuple[Import, ...]:
    found: list[Import] = []
    for module, path in modules().items():
        visitor = _Imports(module, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(), str(path)))
        found += visitor.found
    return tuple(found)


def _within(module: str, prefix: str) -> bool:
    if prefix == PACKAGE:  # the package's own __init__, not everything under it
        return module == PACKAGE
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> int | None:
    matches = [
        (len(prefix), rank)
        for rank, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if _within(module, prefix)
    ]
    return max(matches)[1] if matches else None


def _ours() -> Iterator[Import]:
    return (i for i in imports() if i.target == PACKAGE or i.target.startswith(PACKAGE + "."))


def _show(found: list[Import]) -> str:
    return "\n".join(f"{i.module}:{i.line} imports {i.target}" for i in found)


def test_the_walk_finds_the_imports_it_checks() -> None:
    """The parse sees what the rules are about (an empty walk would pass every rule)."""
    found = {(i.module, i.target, i.lazy) for i in imports()}
    assert ("vgpu_hypervisor.daemon.node", "vgpu_hypervisor.daemon.pods", False) in found
    assert ("vgpu_hypervisor.daemon.service", "vgpu_hypervisor.kubernetes.setup", True) in found
    assert ("vgpu_hypervisor.kubernetes.setup", "vgpu_hypervisor.daemon.node", True) in found
    assert ("vgpu_hypervisor.daemon.api.app", "vgpu_hypervisor.daemon.api.routes.pods", False) in (
        found
    )


def test_every_module_has_its_layer() -> None:
    assert [module for module in modules() if layer_of(module) is None] == []


def test_no_import_runs_back_up() -> None:
    upward = []
    for found in _ours():
        here, there = layer_of(found.module), layer_of(found.target)
        assert here is not None and there is not None, found
        if there > here:
            upward.append(found)
    assert upward == [], "imports from a layer above:\n" + _show(upward)


def test_only_the_adapters_and_the_one_wiring_module_import_the_adapters() -> None:
    """The core, the base and the front never name Kubernetes or the device plugin; the wiring
    module does so only lazily (when the settings ask for them)."""
    outside = [
        i
        for i in _ours()
        if any(_within(i.target, adapter) for adapter in ADAPTERS)
        and not any(_within(i.module, adapter) for adapter in ADAPTERS)
    ]
    elsewhere = [i for i in outside if i.module != WIRING]
    assert elsewhere == [], _show(elsewhere)
    eager = [i for i in outside if not i.lazy]
    assert eager == [], "loaded with the daemon whatever the settings:\n" + _show(eager)
    assert outside  # the wiring module does wire them in


def test_only_the_adapters_import_the_kubernetes_extra() -> None:
    extra = [
        i
        for i in imports()
        if any(_within(i.target, name) for name in KUBERNETES_MODULES)
        and not any(_within(i.module, adapter) for adapter in ADAPTERS)
    ]
    assert extra == [], _show(extra)


# Runs the CLI with the kubernetes extra's packages unimportable (None in sys.modules).
WITHOUT_EXTRA = (
    "import sys\n"
    f"for name in {KUBERNETES_MODULES!r}:\n"
    "    sys.modules[name] = None\n"
    "from vgpu_hypervisor.cli import main\n"
    "sys.argv[0] = 'tf-hypervisor'\n"
    "main()\n"
)


def test_a_bare_daemon_runs_without_the_kubernetes_extra(tmp_path: Path) -> None:
    """Started, through its passes over a pod and stopped, with gRPC, protobuf and lightkube
    unimportable and outside any cluster: none of it needs them, and no task fails for want
    of them."""
    daemon = Daemon(tmp_path, gpus=1)
    daemon.launcher = [sys.executable, "-c", WITHOUT_EXTRA]
    daemon.environment = {
        k: v for k, v in daemon.environment.items() if not k.startswith("KUBERNETES_")
    }
    daemon.start()
    try:
        body = {"name": "bare", "gpus": {"0": {"memory": "1GiB", "compute": 50}}}
        created = daemon.api("POST", "/api/v1/pods", json=body)
        assert created.status_code == 201, created.text
        time.sleep(1.5)  # pod passes and GPU samples run meanwhile
        pods = daemon.api("GET", "/api/v1/pods").json()
        assert [(pod["name"], pod["error"]) for pod in pods] == [("bare", None)]
        assert daemon.stop(signal.SIGTERM) == 0
    finally:
        daemon.close()
    log = daemon.log_file.read_text()
    assert " failed" not in log and "Traceback" not in log, log
