"""Helm against the test bed's API server, with Helm's own state kept in a temp dir."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class HelmError(RuntimeError):
    pass


@dataclass
class Helm:
    binary: Path
    kubeconfig: Path
    home: Path
    """Holds Helm's cache, config and data dirs: nothing is written to the user's home."""
    releases: list[tuple[str, str]] = field(default_factory=list)
    """(release, namespace) of every install that succeeded, for undoing them."""

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            KUBECONFIG=str(self.kubeconfig),
            HELM_CACHE_HOME=str(self.home / "cache"),
            HELM_CONFIG_HOME=str(self.home / "config"),
            HELM_DATA_HOME=str(self.home / "data"),
        )
        return env

    def run(self, *args: str, timeout: float = 300.0) -> str:
        argv = [str(self.binary), *args]
        proc = subprocess.run(
            argv, env=self.env(), capture_output=True, text=True, timeout=timeout, check=False
        )
        if proc.returncode != 0:
            raise HelmError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr.strip()}")
        return proc.stdout

    def version(self) -> str:
        return self.run("version", "--template", "{{.Version}}").strip()

    def install(
        self,
        release: str,
        chart: Path,
        *,
        namespace: str,
        values: dict[str, Any] | None = None,
        values_files: tuple[Path, ...] = (),
        wait: bool = False,
    ) -> dict[str, Any]:
        """`helm install`; returns Helm's JSON description of the release."""
        args = ["install", release, str(chart), "--namespace", namespace, "--output", "json"]
        for f in values_files:
            args += ["--values", str(f)]
        if values:
            values_path = self.home / f"{release}-values.yaml"
            values_path.parent.mkdir(parents=True, exist_ok=True)
            values_path.write_text(yaml.safe_dump(values))
            args += ["--values", str(values_path)]
        if wait:
            args.append("--wait")
        answer = dict(json.loads(self.run(*args)))
        self.releases.append((release, namespace))
        return answer

    def upgrade(self, release: str, chart: Path, *, namespace: str,
                values: dict[str, Any]) -> dict[str, Any]:
        """`helm upgrade` of an installed release with these values (not merged with the old)."""
        values_path = self.home / f"{release}-upgrade-values.yaml"
        values_path.parent.mkdir(parents=True, exist_ok=True)
        values_path.write_text(yaml.safe_dump(values))
        return dict(json.loads(self.run("upgrade", release, str(chart), "--namespace", namespace,
                                        "--values", str(values_path), "--output", "json")))

    def uninstall(self, release: str, *, namespace: str) -> None:
        self.run("uninstall", release, "--namespace", namespace)
        if (release, namespace) in self.releases:
            self.releases.remove((release, namespace))


def uninstall_all(helms: list[Helm]) -> list[str]:
    """Teardown: uninstall every release these Helms installed and remove their homes; the
    failures, each naming its release (the rest are still uninstalled)."""
    errors = []
    for helm in helms:
        for release, namespace in list(helm.releases):
            try:
                helm.uninstall(release, namespace=namespace)
            except Exception as e:  # uninstall the rest anyway
                errors.append(f"{release} in {namespace}: {e}")
        shutil.rmtree(helm.home, ignore_errors=True)
    return errors
