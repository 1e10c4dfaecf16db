"""deploy/ names the image ``./dev image`` builds, and deploy/README.md's push command and
overlay rename it as written.

The overlay is taken from deploy/README.md (the YAML block with ``images:``) and rendered by
``tests/deploy/kustomize.py`` over a copy of ``deploy/`` placed at ``../../deploy`` from it, as
the README lays it out. Building and running the image is tests/deploy/test_image.py.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from kura import __version__
from tests.deploy.conftest import DEPLOY
from tests.deploy.kustomize import KustomizeError, Manifest, render, split_image

BUILT = f"localhost/kura:{__version__}"
README = DEPLOY / "README.md"


def _images(manifests: list[Manifest]) -> dict[str, str]:
    """``{"Kind name/container": image}`` for every container and init container."""
    out: dict[str, str] = {}

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("containers", "initContainers"):
                    for c in value:
                        out[f"{where}/{c['name']}"] = c["image"]
                else:
                    walk(value, where)
        elif isinstance(node, list):
            for item in node:
                walk(item, where)

    for m in manifests:
        walk(m.obj, f"{m.kind} {m.name}")
    return out


def _readme_overlay() -> dict[str, Any]:
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), re.DOTALL)
    overlays = [yaml.safe_load(b) for b in blocks if "images:" in b]
    assert len(overlays) == 1, "deploy/README.md must show exactly one overlay with images:"
    overlay: dict[str, Any] = overlays[0]
    return overlay


def _render_overlay(tmp_path: Path, overlay: dict[str, Any]) -> list[Manifest]:
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    directory = tmp_path / "overlays" / "production"
    directory.mkdir(parents=True)
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    return render(directory, root=tmp_path)


def test_every_container_in_deploy_runs_the_image_dev_image_builds(
    manifests: list[Manifest],
) -> None:
    images = _images(manifests)
    assert set(images) == {"StatefulSet kura/kura", "DaemonSet kured/kured"}
    assert set(images.values()) == {BUILT}


def test_kured_runs_as_root_in_the_image_whose_user_is_kuras(manifests: list[Manifest]) -> None:
    """The image's USER is 10001 (kura's); kured's nsenter and reboot need root, so the DaemonSet
    must ask for uid 0, while kura's StatefulSet runs as the image's user."""
    by_kind = {
        m.kind: m.obj["spec"]["template"]["spec"]
        for m in manifests
        if m.kind in ("StatefulSet", "DaemonSet")
    }
    kured = by_kind["DaemonSet"]["containers"][0]["securityContext"]
    assert (kured["runAsUser"], kured["runAsGroup"], kured["privileged"]) == (0, 0, True)
    kura = by_kind["StatefulSet"]["securityContext"]
    assert (kura["runAsUser"], kura["runAsGroup"], kura["fsGroup"]) == (10001, 10001, 10001)


def test_the_readme_overlay_names_the_pushed_image_in_every_container(tmp_path: Path) -> None:
    overlay = _readme_overlay()
    assert overlay["resources"] == ["../../deploy"]
    (rule,) = overlay["images"]
    pushed = f"{rule['newName']}:{rule['newTag']}"
    push = re.search(r"^podman push (\S+) (\S+)$", README.read_text(), re.MULTILINE)
    assert push is not None, "deploy/README.md has no `podman push` line"
    assert push.groups() == (BUILT, pushed)

    images = _images(_render_overlay(tmp_path, overlay))
    assert set(images) == {"StatefulSet kura/kura", "DaemonSet kured/kured"}
    assert set(images.values()) == {pushed}


def test_an_overlay_naming_another_image_changes_nothing(tmp_path: Path) -> None:
    """The check above can fail: a rule for the old placeholder's name matches no container."""
    overlay = _readme_overlay()
    overlay["images"] = [{"name": "ghcr.io/kura-dev/kura", "newName": "registry.example/kura"}]
    assert set(_images(_render_overlay(tmp_path, overlay)).values()) == {BUILT}


def test_images_rules_follow_kustomize() -> None:
    assert split_image("registry.example:5000/team/kura:1.2@sha256:ab") == (
        "registry.example:5000/team/kura",
        ":1.2",
        "@sha256:ab",
    )
    assert split_image("registry.example:5000/kura") == ("registry.example:5000/kura", "", "")


def test_an_images_entry_without_a_name_or_with_an_unknown_key_is_refused(
    tmp_path: Path,
) -> None:
    overlay = _readme_overlay()
    overlay["images"] = [{"newName": "registry.example/kura"}]
    with pytest.raises(KustomizeError, match="needs a name"):
        _render_overlay(tmp_path / "a", overlay)
    overlay["images"] = [{"name": "localhost/kura", "newImage": "x"}]
    with pytest.raises(KustomizeError, match="newImage not supported"):
        _render_overlay(tmp_path / "b", overlay)
