"""The single doorway to pyVmomi: its namespaces, typed as `Any` on purpose.

pyVmomi builds its types at run time; mypy sees them as untyped callables. Rather
than sprinkle ignores over every module, the rest of the package imports `vim`,
`vmodl` and the stub classes from here and exposes only frozen dataclasses upward.
"""

from __future__ import annotations

import importlib
from typing import Any


class Lazy:
    """A pyVmomi namespace or type (`"vim.vm.device"`), imported on first attribute access.

    pyVmomi's type tables cost about 16 MB of RSS when loaded; an operator with no
    VsphereAgentPool (or a CLI command that never reaches vCenter) never loads them.
    So no module reads a pyVmomi attribute at import time: module-level shorthands are
    `Lazy` too, and `isinstance` checks name their types inside functions.
    """

    __slots__ = ("_path", "_target")

    def __init__(self, path: str) -> None:
        self._path = path
        self._target: Any = None

    def __getattr__(self, attribute: str) -> Any:
        if self._target is None:
            target: Any = importlib.import_module("pyVmomi")
            for part in self._path.split("."):
                target = getattr(target, part)
            self._target = target
        return getattr(self._target, attribute)


vim: Any = Lazy("vim")
vmodl: Any = Lazy("vmodl")
PC: Any = Lazy("vmodl.query.PropertyCollector")


def soap_stub_adapter(*args: Any, **kwargs: Any) -> Any:
    """`pyVmomi.SoapAdapter.SoapStubAdapter(...)`."""
    from pyVmomi import SoapAdapter  # noqa: PLC0415 - pyVmomi on first use

    return SoapAdapter.SoapStubAdapter(*args, **kwargs)


def vim25_versions() -> list[tuple[str, str]]:
    """(pyVmomi version name, the id vCenter lists) for vim25, most preferred first."""
    from pyVmomi import VmomiSupport  # noqa: PLC0415 - pyVmomi on first use

    versions: Any = VmomiSupport.GetServiceVersions
    return [(v, str(VmomiSupport.versionIdMap[v])) for v in versions("vim25")]
