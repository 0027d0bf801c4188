"""The single doorway to pyVmomi: its namespaces, typed as `Any` on purpose.

pyVmomi builds its types at run time; mypy sees them as untyped callables. Rather
than sprinkle ignores over every module, the rest of the package imports `vim`,
`vmodl` and the stub classes from here and exposes only frozen dataclasses upward.

**PropertyCollector reads** (`retrieve`, `Fetched`): many properties of many objects in
one round trip. Reading `vm.config.uuid` through a pyVmomi stub costs a request per
attribute; the collector returns every wanted path of every listed object at once. These
helpers are blocking (run them through `Session.call`) and return plain dicts keyed by
property path, so parsing into frozen dataclasses stays pure.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
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


# --- PropertyCollector reads ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fetched:
    """One object's properties; `missing` lists paths vCenter could not read."""

    ref: Any
    props: dict[str, Any]
    missing: tuple[str, ...]

    @property
    def moid(self) -> str:
        return str(self.ref._moId)


def object_specs(refs: Iterable[Any]) -> list[Any]:
    return [PC.ObjectSpec(obj=ref, skip=False) for ref in refs]


def retrieve(
    content: Any,
    *,
    objects: Sequence[Any],
    props: Sequence[tuple[Any, Sequence[str]]],
) -> list[Fetched]:
    """`RetrievePropertiesEx` (following continuation tokens) -> one `Fetched` each.

    `objects` are ObjectSpecs (see `object_specs`, or specs with traversals);
    `props` pairs a managed object type with the paths to read for it.
    """
    spec = PC.FilterSpec(
        objectSet=list(objects),
        propSet=[PC.PropertySpec(type=t, pathSet=list(paths)) for t, paths in props],
        reportMissingObjectsInResults=True,
    )
    collector = content.propertyCollector
    result = collector.RetrievePropertiesEx(specSet=[spec], options=PC.RetrieveOptions())
    out: list[Fetched] = []
    while result is not None:
        for obj in result.objects or []:
            values = {p.name: p.val for p in obj.propSet or []}
            missing = tuple(m.path for m in obj.missingSet or [])
            out.append(Fetched(ref=obj.obj, props=values, missing=missing))
        token = result.token
        result = collector.ContinueRetrievePropertiesEx(token=token) if token else None
    return out


def is_gone(fetched: Fetched) -> bool:
    """vCenter reported the object itself as missing (deleted meanwhile)."""
    return bool(fetched.missing) and not fetched.props


def children_spec(folder: Any) -> Any:
    """An ObjectSpec that visits the direct children of a folder (not the folder)."""
    traverse = PC.TraversalSpec(name="children", type=vim.Folder, path="childEntity", skip=False)
    return PC.ObjectSpec(obj=folder, skip=True, selectSet=[traverse])


def view_filter_spec(view: Any, wanted: Sequence[tuple[Any, Sequence[str]]]) -> Any:
    """A filter over whatever a `ListView` holds, reading `wanted` paths per type."""
    traverse = PC.TraversalSpec(name="view", type=vim.view.ListView, path="view", skip=False)
    return PC.FilterSpec(
        objectSet=[PC.ObjectSpec(obj=view, skip=True, selectSet=[traverse])],
        propSet=[PC.PropertySpec(type=t, pathSet=list(paths)) for t, paths in wanted],
    )
