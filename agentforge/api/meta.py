"""Object metadata and references, as the operator reads them from any kind.

Only the metadata fields the reconcilers use are modelled (the informer cache keeps
no more, see `trim`); everything else the API server sends is ignored on parse.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pydantic import ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from agentforge.api.fields import DNS1123Subdomain, KubeModel, Time, View


class NamespacedName(NamedTuple):
    """An object's namespace and name: how two references are compared (never by name
    alone: objects of one name live in many namespaces)."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class OwnerReference(View):
    api_version: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(View):
    """metadata of any object (the subset the reconcilers read)."""

    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    creation_timestamp: Time | None = None
    deletion_timestamp: Time | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: tuple[str, ...] = ()
    owner_references: tuple[OwnerReference, ...] = ()

    @model_serializer(mode="wrap")
    def _omit_empty(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Leave out empty fields, as Kubernetes' `omitempty` does."""
        data: dict[str, Any] = handler(self)
        return {key: value for key, value in data.items() if value not in ("", 0, None, {}, [])}

    @property
    def deleting(self) -> bool:
        """True once deletion was requested (finalizers may still hold the object)."""
        return self.deletion_timestamp is not None

    @property
    def key(self) -> str:
        """`namespace/name`, the work-queue key convention of client-go."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    def owner(self, *, kind: str) -> OwnerReference | None:
        """The first ownerReference of `kind` (the controller one when several)."""
        refs = [ref for ref in self.owner_references if ref.kind == kind]
        return next((ref for ref in refs if ref.controller), refs[0] if refs else None)


class LocalObjectReference(KubeModel):
    """A reference to an object in the same namespace."""

    name: DNS1123Subdomain
    """The referenced object's metadata.name."""


class ObjectReference(KubeModel):
    """A reference to any object (corev1.ObjectReference, replaced as a whole)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-map-type": "atomic"})

    api_version: str | None = None
    """API version of the referent."""
    kind: str | None = None
    """Kind of the referent."""
    name: str | None = None
    """Name of the referent."""
    namespace: str | None = None
    """Namespace of the referent."""
    uid: str | None = None
    """UID of the referent."""
    resource_version: str | None = None
    """Specific resourceVersion to which this reference is made, if any."""
    field_path: str | None = None
    """A piece of the object, if the reference is not to the entire object."""
