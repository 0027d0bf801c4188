"""The single doorway to pyVmomi: its namespaces, typed as `Any` on purpose.

pyVmomi builds its types at run time; mypy sees them as untyped callables. Rather
than sprinkle ignores over every module, the rest of the package imports `vim`,
`vmodl` and `connect_stub` from here and exposes only frozen dataclasses upward.
"""

from __future__ import annotations

from typing import Any

import pyVmomi
from pyVim import connect as _connect

vim: Any = pyVmomi.vim
vmodl: Any = pyVmomi.vmodl
smart_stub_adapter: Any = _connect.SmartStubAdapter
