"""Render the kustomizations under ``deploy/`` offline, following ``resources:`` (and ``images:``).

``kubectl kustomize`` is not something ``./dev test`` can install (neither PyPI nor Debian 12
ship a current kubectl or kustomize), so the tests render ``deploy/`` themselves. The
kustomizations there use nothing but ``resources:`` on purpose (``deploy/kustomization.yaml``
says why), so following that key is the whole of what kustomize would do with them, and
``render`` refuses any other key instead of silently ignoring a transformer it does not
implement. The one transformer it implements is ``images:`` (``name``, ``newName``, ``newTag``,
``digest``, as kustomize's images transformer: https://kubectl.docs.kubernetes.io/references/kustomize/kustomization/images/),
which the overlay in deploy/README.md uses to name a pushed image. Output order is kustomize's
input order: depth-first through ``resources:``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION_FILE = "kustomization.yaml"
KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "images"}
IMAGE_KEYS = {"name", "newName", "newTag", "digest"}


class KustomizeError(Exception):
    """A kustomization or manifest that cannot be rendered (with the file to blame)."""


@dataclass(frozen=True)
class Manifest:
    """One Kubernetes object and the file it was read from."""

    source: Path
    obj: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.obj["kind"])

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def namespace(self) -> str | None:
        ns = self.obj["metadata"].get("namespace")
        return None if ns is None else str(ns)

    def ref(self) -> str:
        """``Kind namespace/name`` (``Kind name`` for cluster-scoped objects), for messages."""
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"


def render(directory: Path, root: Path | None = None) -> list[Manifest]:
    """Every object the kustomization in ``directory`` produces, in order.

    Resources must lie in ``root``'s tree (default: ``directory``'s). Raises ``KustomizeError``
    for a missing kustomization or resource, a key other than ``apiVersion``/``kind``/
    ``resources``/``images``, an ``images:`` entry without ``name`` or with another key, a
    resource outside ``root``, a document that is not an object with apiVersion, kind and
    metadata.name, or the same object twice.
    """
    root = (directory if root is None else root).resolve()
    directory = directory.resolve()
    out: list[Manifest] = []
    _render_dir(root, directory, out, chain=())
    seen: dict[tuple[str, str, str | None, str], Path] = {}
    for m in out:
        key = (str(m.obj["apiVersion"]).split("/")[0], m.kind, m.namespace, m.name)
        if key in seen:
            raise KustomizeError(f"{m.ref()} is defined twice: in {seen[key]} and {m.source}")
        seen[key] = m.source
    return out


def _render_dir(root: Path, directory: Path, out: list[Manifest], chain: tuple[Path, ...]) -> None:
    if directory in chain:
        raise KustomizeError(f"kustomization cycle through {directory}")
    path = directory / KUSTOMIZATION_FILE
    if not path.is_file():
        raise KustomizeError(f"{directory} has no {KUSTOMIZATION_FILE}")
    doc = _load_one(path)
    unknown = sorted(set(doc) - KUSTOMIZATION_KEYS)
    if unknown:
        raise KustomizeError(
            f"{path}: {', '.join(unknown)} not supported here; deploy/ uses `resources:` only"
        )
    if doc.get("kind") != "Kustomization":
        raise KustomizeError(f"{path}: kind must be Kustomization")
    resources = doc.get("resources") or []
    if not isinstance(resources, list):
        raise KustomizeError(f"{path}: resources must be a list")
    images = _image_rules(path, doc.get("images") or [])
    first = len(out)
    for entry in resources:
        target = (directory / str(entry)).resolve()
        if not target.is_relative_to(root):
            raise KustomizeError(f"{path}: resource {entry!r} is outside {root}")
        if target.is_dir():
            _render_dir(root, target, out, (*chain, directory))
        elif target.is_file():
            out.extend(_load_objects(target))
        else:
            raise KustomizeError(f"{path}: resource {entry!r} does not exist")
    for m in out[first:]:
        _set_images(m.obj, images)


def _image_rules(path: Path, images: object) -> list[dict[str, str]]:
    if not isinstance(images, list):
        raise KustomizeError(f"{path}: images must be a list")
    rules = []
    for rule in images:
        if not isinstance(rule, dict) or not isinstance(rule.get("name"), str):
            raise KustomizeError(f"{path}: every images: entry needs a name")
        unknown = sorted(set(rule) - IMAGE_KEYS)
        if unknown:
            raise KustomizeError(f"{path}: images: {', '.join(unknown)} not supported here")
        rules.append({k: str(v) for k, v in rule.items()})
    return rules


def split_image(image: str) -> tuple[str, str, str]:
    """``registry/name:tag@digest`` as ``(name, ":tag" or "", "@digest" or "")``: the tag is
    after the last ``:`` that follows the last ``/``, so a registry's port stays in the name."""
    name, at, digest = image.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = ""
    if colon > slash:
        name, tag = name[:colon], name[colon:]
    return name, tag, at + digest


def _set_images(node: object, rules: list[dict[str, str]]) -> None:
    """Apply ``rules`` to every ``containers``/``initContainers`` image below ``node``."""
    if isinstance(node, list):
        for item in node:
            _set_images(item, rules)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key in ("containers", "initContainers") and isinstance(value, list):
            for c in value:
                if isinstance(c, dict) and isinstance(c.get("image"), str):
                    c["image"] = _new_image(c["image"], rules)
        _set_images(value, rules)


def _new_image(image: str, rules: list[dict[str, str]]) -> str:
    name, tag, digest = split_image(image)
    for rule in rules:
        if rule["name"] == name:
            if "digest" in rule:
                tag, digest = "", "@" + rule["digest"]
            elif "newTag" in rule:
                tag, digest = ":" + rule["newTag"], ""
            return rule.get("newName", name) + tag + digest
    return image


def _load_one(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise KustomizeError(f"{path}: not YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise KustomizeError(f"{path}: expected a mapping")
    return doc


def _load_objects(path: Path) -> list[Manifest]:
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as exc:
        raise KustomizeError(f"{path}: not YAML: {exc}") from exc
    objects = []
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise KustomizeError(f"{path}: document {i} is not a mapping")
        for key in ("apiVersion", "kind"):
            if not isinstance(doc.get(key), str):
                raise KustomizeError(f"{path}: document {i} has no {key}")
        meta = doc.get("metadata")
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
            raise KustomizeError(f"{path}: document {i} ({doc['kind']}) has no metadata.name")
        objects.append(Manifest(path, doc))
    return objects
