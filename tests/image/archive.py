"""Reads a docker-archive (what ci/build-image writes and containerd imports) without a runtime:
its manifest, image config and the files of its layers."""

from __future__ import annotations

import json
import tarfile
from functools import cached_property
from pathlib import Path
from typing import Any


class Archive:
    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self, name: str) -> bytes:
        with tarfile.open(self.path) as tar:
            f = tar.extractfile(name)
            assert f is not None, f"{self.path}: no {name}"
            return f.read()

    @cached_property
    def manifest(self) -> dict[str, Any]:
        entries: list[dict[str, Any]] = json.loads(self._read("manifest.json"))
        assert len(entries) == 1, f"{self.path}: {len(entries)} images, expected 1"
        return entries[0]

    @cached_property
    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = json.loads(self._read(self.manifest["Config"]))
        return config

    @cached_property
    def files(self) -> dict[str, tarfile.TarInfo]:
        """The image's file system: path (no leading /) to its entry in the top-most layer."""
        result: dict[str, tarfile.TarInfo] = {}
        with tarfile.open(self.path) as outer:
            for layer in self.manifest["Layers"]:
                f = outer.extractfile(layer)
                assert f is not None
                with tarfile.open(fileobj=f) as tar:
                    for m in tar:
                        name = m.name.lstrip("./")
                        base = name.rsplit("/", 1)[-1]
                        if base.startswith(".wh."):
                            target = name[: -len(base)] + base[4:]
                            for k in [
                                k for k in result if k == target or k.startswith(target + "/")
                            ]:
                                del result[k]
                            continue
                        result[name] = m
        return result

    def read_file(self, path: str) -> bytes:
        """The content of a regular file of the image (top-most layer that has it)."""
        path = path.lstrip("/")
        with tarfile.open(self.path) as outer:
            for layer in reversed(self.manifest["Layers"]):
                f = outer.extractfile(layer)
                assert f is not None
                with tarfile.open(fileobj=f) as tar:
                    try:
                        m = tar.getmember(path)
                    except KeyError:
                        try:
                            m = tar.getmember("./" + path)
                        except KeyError:
                            continue
                    data = tar.extractfile(m)
                    assert data is not None, f"{path} is not a regular file"
                    return data.read()
        raise FileNotFoundError(path)
