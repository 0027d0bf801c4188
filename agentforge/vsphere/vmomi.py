"""The single doorway to pyVmomi: its namespaces, typed as `Any` on purpose.

pyVmomi builds its types at run time; mypy sees them as untyped callables. Rather
than sprinkle ignores over every module, the rest of the package imports `vim`,
`vmodl` and the stub classes from here and exposes only frozen dataclasses upward.
"""

from __future__ import annotations

from typing import Any

from pyVmomi import SoapAdapter as _soap
from pyVmomi import VmomiSupport as _support
from pyVmomi import vim as _vim
from pyVmomi import vmodl as _vmodl

vim: Any = _vim
vmodl: Any = _vmodl
soap_stub_adapter: Any = _soap.SoapStubAdapter


def vim25_versions() -> list[tuple[str, str]]:
    """(pyVmomi version name, the id vCenter lists) for vim25, most preferred first."""
    versions: Any = _support.GetServiceVersions
    return [(v, str(_support.versionIdMap[v])) for v in versions("vim25")]
