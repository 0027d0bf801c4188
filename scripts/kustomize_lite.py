"""Render the kustomizations under `config/` without kustomize (the subset they use).

`make deploy` and `make install` must work on a machine with neither kubectl nor
kustomize, so this module renders a kustomization directory to a list of objects
with the few features `config/` uses, and refuses any other feature instead of
ignoring it (a silently skipped transformer would deploy something else than
`kubectl apply -k` does):

* `resources`: YAML files (every document) and directories holding a
  `kustomization.yaml`, rendered recursively, in order;
* `images`: `name` -> `newName` / `newTag` / `digest`, applied to the containers
  and init containers of pod templates, including those of nested kustomizations;
* `configMapGenerator` with `files` (`key=path` or `path`) and `options.labels` /
  `options.annotations`, only with `generatorOptions.disableNameSuffixHash: true`
  (the hash suffix would need kustomize's exact hashing).

An object id (group, kind, namespace, name) may appear once, as in kustomize. The
unit tests compare this renderer's output with `kubectl kustomize` when kubectl is
installed, so the two cannot drift apart unnoticed.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "KUSTOMIZATION",
    "SUPPORTED_FIELDS",
    "KustomizeError",
    "ObjectId",
    "Rendered",
    "load_kustomization",
    "object_id",
    "plain",
    "render",
    "set_image",
]

KUSTOMIZATION = "kustomization.yaml"
SUPPORTED_FIELDS = frozenset(
    {"apiVersion", "kind", "resources", "images", "configMapGenerator", "generatorOptions"}
)
_GENERATOR_FIELDS = frozenset({"name", "namespace", "files", "options"})
_IMAGE_FIELDS = frozenset({"name", "newName", "newTag", "digest"})

JsonObj = dict[str, Any]


class KustomizeError(Exception):
    """A kustomization this renderer cannot render faithfully, or a broken one."""


@dataclass(frozen=True, slots=True, order=True)
class ObjectId:
    group: str
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        kind = f"{self.kind}.{self.group}" if self.group else self.kind
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{kind} {where}{self.name}"


@dataclass(frozen=True, slots=True)
class Rendered:
    """One object and the file it came from (for error messages)."""

    obj: JsonObj
    source: Path


def object_id(obj: Mapping[str, Any]) -> ObjectId:
    api_version = str(obj.get("apiVersion", ""))
    group = api_version.rpartition("/")[0]
    meta = obj.get("metadata") or {}
    return ObjectId(group, str(obj.get("kind", "")), meta.get("namespace") or "", meta["name"])


def load_kustomization(directory: Path) -> JsonObj:
    """The parsed `kustomization.yaml` of `directory`, checked for unsupported fields."""
    path = directory / KUSTOMIZATION
    if not path.is_file():
        raise KustomizeError(f"{directory} has no {KUSTOMIZATION}")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise KustomizeError(f"{path}: not a mapping")
    unsupported = sorted(set(data) - SUPPORTED_FIELDS)
    if unsupported:
        raise KustomizeError(
            f"{path}: {', '.join(unsupported)} not supported by scripts/kustomize_lite.py; "
            "extend it (and its comparison test) or restructure the kustomization"
        )
    if data.get("kind", "Kustomization") != "Kustomization":
        raise KustomizeError(f"{path}: kind must be Kustomization")
    return data


def render(directory: Path, *, images: Iterable[Mapping[str, str]] = ()) -> list[Rendered]:
    """Every object of the kustomization in `directory`, in resource order.

    `images` are extra `images` entries applied last (as `kustomize edit set image`
    would have written them into the top kustomization).
    """
    objects = _render(directory.resolve(), stack=())
    _check_unique(objects)
    for entry in images:
        _apply_image(objects, entry)
    return objects


def set_image(image: str) -> JsonObj:
    """An `images` entry that replaces the operator image `agent-forge` by `image`.

    `image` is `name[:tag]` or `name@sha256:...` (a registry port is not a tag).
    """
    name, digest = image, ""
    if "@" in image:
        name, _, digest = image.partition("@")
    tag = ""
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
    if not name:
        raise KustomizeError(f"{image!r} is not an image reference")
    entry: JsonObj = {"name": "agent-forge", "newName": name}
    if digest:
        entry["digest"] = digest
    elif tag:
        entry["newTag"] = tag
    return entry


# --- rendering -----------------------------------------------------------------------


def _render(directory: Path, *, stack: tuple[Path, ...]) -> list[Rendered]:
    if directory in stack:
        raise KustomizeError(f"kustomization cycle: {' -> '.join(map(str, (*stack, directory)))}")
    data = load_kustomization(directory)
    out: list[Rendered] = []
    for entry in data.get("resources") or []:
        target = (directory / str(entry)).resolve()
        if target.is_dir():
            out.extend(_render(target, stack=(*stack, directory)))
        elif target.is_file():
            if directory not in target.parents:
                raise KustomizeError(
                    f"{directory / KUSTOMIZATION}: file resource {entry!r} is outside the "
                    "kustomization directory (kustomize refuses it; list its directory instead)"
                )
            out.extend(_documents(target))
        else:
            raise KustomizeError(
                f"{directory / KUSTOMIZATION}: resource {entry!r} does not exist ({target})"
            )
    out.extend(_generated(directory, data))
    for entry in data.get("images") or []:
        _apply_image(out, entry)
    return out


def _documents(path: Path) -> Iterator[Rendered]:
    try:
        docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except yaml.YAMLError as exc:
        raise KustomizeError(f"{path}: {exc}") from None
    for doc in docs:
        if doc is None:
            continue
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            raise KustomizeError(f"{path}: a document without apiVersion and kind")
        if not (doc.get("metadata") or {}).get("name"):
            raise KustomizeError(f"{path}: a {doc['kind']} without metadata.name")
        yield Rendered(doc, path)


def _generated(directory: Path, data: Mapping[str, Any]) -> Iterator[Rendered]:
    generators = data.get("configMapGenerator") or []
    if not generators:
        return
    path = directory / KUSTOMIZATION
    options = data.get("generatorOptions") or {}
    if options.get("disableNameSuffixHash") is not True:
        raise KustomizeError(
            f"{path}: configMapGenerator needs generatorOptions.disableNameSuffixHash: true "
            "(the offline renderer does not compute kustomize's name hash)"
        )
    for generator in generators:
        unsupported = sorted(set(generator) - _GENERATOR_FIELDS)
        if unsupported:
            raise KustomizeError(f"{path}: configMapGenerator field(s) {unsupported} unsupported")
        data_out: dict[str, str] = {}
        for spec in generator.get("files") or []:
            key, sep, rel = str(spec).partition("=")
            if not sep:
                key, rel = Path(spec).name, str(spec)
            file = (directory / rel).resolve()
            if directory not in file.parents:
                raise KustomizeError(f"{path}: {rel} is outside the kustomization directory")
            if not file.is_file():
                raise KustomizeError(f"{path}: configMapGenerator file {rel!r} does not exist")
            data_out[key] = file.read_text(encoding="utf-8")
        meta: JsonObj = {"name": generator["name"]}
        if generator.get("namespace"):
            meta["namespace"] = generator["namespace"]
        gen_options = generator.get("options") or {}
        for field in ("annotations", "labels"):
            merged = {**(options.get(field) or {}), **(gen_options.get(field) or {})}
            if merged:
                meta[field] = {k: str(v) for k, v in merged.items()}
        obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data_out}
        yield Rendered(obj, path)


def _check_unique(objects: list[Rendered]) -> None:
    seen: dict[ObjectId, Path] = {}
    for item in objects:
        oid = object_id(item.obj)
        if oid in seen:
            raise KustomizeError(f"{oid} is defined twice: {seen[oid]} and {item.source}")
        seen[oid] = item.source


# --- images --------------------------------------------------------------------------


def _image_name(image: str) -> str:
    name = image.partition("@")[0]
    slash, colon = name.rfind("/"), name.rfind(":")
    return name[:colon] if colon > slash else name


def _apply_image(objects: list[Rendered], entry: Mapping[str, Any]) -> None:
    unsupported = sorted(set(entry) - _IMAGE_FIELDS)
    if unsupported or "name" not in entry:
        raise KustomizeError(f"images entry {dict(entry)}: needs name; unsupported {unsupported}")
    for item in objects:
        for container in _containers(item.obj):
            image = str(container.get("image", ""))
            if _image_name(image) != entry["name"]:
                continue
            name = str(entry.get("newName") or _image_name(image))
            rest = image[len(_image_name(image)) :]
            if entry.get("digest"):
                container["image"] = f"{name}@{entry['digest']}"
            elif entry.get("newTag"):
                container["image"] = f"{name}:{entry['newTag']}"
            else:
                container["image"] = name + rest


def _containers(obj: JsonObj) -> Iterator[JsonObj]:
    spec = obj.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec")
    if obj.get("kind") == "Pod":
        pod = spec
    elif obj.get("kind") == "CronJob":
        job = (spec.get("jobTemplate") or {}).get("spec") or {}
        pod = (job.get("template") or {}).get("spec")
    if not isinstance(pod, dict):
        return
    for field in ("initContainers", "containers"):
        yield from pod.get(field) or []


def plain(objects: Iterable[Rendered]) -> list[JsonObj]:
    """The objects alone, deep-copied (callers may mutate them)."""
    return [copy.deepcopy(item.obj) for item in objects]
