"""Helm, the one wrapper tests, the demo and the benchmarks use: `helm template` and `lint` for the
chart tier (no cluster), install/upgrade/uninstall into the test bed's API server. Helm's own
state is kept in a temp dir, never the user's home."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.parts import REPO_ROOT

CHART = REPO_ROOT / "charts" / "istio-cni"
RELEASE = "istio-cni"
NAMESPACE = "kube-system"


_RENDERS: dict[tuple[str, ...], subprocess.CompletedProcess[str]] = {}
"""`helm template` runs by their command line and the content of every file and dir it names:
the chart tier renders the same values many times (each Helm major, several tests)."""


def _content_digest(args: Sequence[str]) -> str:
    """sha256 over the files (and files under the dirs) the arguments name, paths included."""
    digest = hashlib.sha256()
    for arg in args:
        path = Path(arg)
        if not path.is_absolute() or not path.exists():
            continue
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            digest.update(str(f).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


class HelmError(RuntimeError):
    """A Helm command exited non-zero; the message has the command line and Helm's output."""

    def __init__(self, argv: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        super().__init__(f"{' '.join(argv)} failed ({returncode}):\n{stderr.strip()}\n{stdout}")
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@dataclass
class Helm:
    binary: Path
    home: Path
    """Holds Helm's cache, config and data dirs: nothing is written to the user's home."""
    kubeconfig: Path | None = None
    """The API server to talk to; None for commands that need no cluster (template, lint)."""
    version: str = ""
    """The version ci/setup-helm installed it as (its cache dir name); empty when not known."""
    releases: list[tuple[str, str]] = field(default_factory=list)
    """(release, namespace) of every install that succeeded, for undoing them."""

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            HELM_CACHE_HOME=str(self.home / "cache"),
            HELM_CONFIG_HOME=str(self.home / "config"),
            HELM_DATA_HOME=str(self.home / "data"),
        )
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def call(
        self, *args: str, check: bool = True, timeout: float = 300.0
    ) -> subprocess.CompletedProcess[str]:
        """Run `helm ARGS`; with `check`, a non-zero exit raises HelmError. A `template` of
        the same command line and the same inputs is answered from the last run's output."""
        argv = [str(self.binary), *args]
        key: tuple[str, ...] = ()
        if args and args[0] == "template":
            key = (*argv, str(self.kubeconfig), _content_digest(args))
        proc = _RENDERS.get(key) if key else None
        if proc is None:
            proc = subprocess.run(
                argv, env=self.env(), capture_output=True, text=True, timeout=timeout, check=False
            )
            if key:
                _RENDERS[key] = proc
        if check and proc.returncode != 0:
            raise HelmError(argv, proc.returncode, proc.stdout, proc.stderr)
        return proc

    def run(self, *args: str, timeout: float = 300.0) -> str:
        """Run `helm ARGS` and return its stdout; a non-zero exit raises HelmError."""
        return self.call(*args, timeout=timeout).stdout

    def reported_version(self) -> str:
        """What the binary says it is (`helm version`), e.g. v3.17.3."""
        return self.run("version", "--template", "{{.Version}}").strip()

    def template(
        self,
        *,
        values: Sequence[Path] = (),
        sets: Sequence[str] = (),
        chart: Path = CHART,
        release: str = RELEASE,
        namespace: str = NAMESPACE,
        check: bool = True,
        api_versions: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        """`helm template` of the chart (no cluster needed); `api_versions` as an API server
        serving them would answer discovery (`.Capabilities.APIVersions`)."""
        args = ["template", release, str(chart), "--namespace", namespace]
        for v in values:
            args += ["--values", str(v)]
        for s in sets:
            args += ["--set", s]
        for api in api_versions:
            args += ["--api-versions", api]
        return self.call(*args, check=check)

    def render(self, **kwargs: Any) -> list[dict[str, Any]]:
        """The manifests `helm template` renders, as parsed documents."""
        return [d for d in yaml.safe_load_all(self.template(**kwargs).stdout) if d]

    def install(
        self,
        release: str,
        chart: Path,
        *,
        namespace: str,
        values: dict[str, Any] | None = None,
        values_files: tuple[Path, ...] = (),
        wait: bool = False,
        post_renderer: Path | None = None,
    ) -> dict[str, Any]:
        """`helm install`; returns Helm's JSON description of the release. `post_renderer`: an
        executable Helm pipes the rendered manifests through (Helm 3's --post-renderer)."""
        args = ["install", release, str(chart), "--namespace", namespace, "--output", "json"]
        if post_renderer is not None:
            args += ["--post-renderer", str(post_renderer)]
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

    def upgrade(
        self, release: str, chart: Path, *, namespace: str, values: dict[str, Any]
    ) -> dict[str, Any]:
        """`helm upgrade` of an installed release with these values (not merged with the old)."""
        values_path = self.home / f"{release}-upgrade-values.yaml"
        values_path.parent.mkdir(parents=True, exist_ok=True)
        values_path.write_text(yaml.safe_dump(values))
        return dict(
            json.loads(
                self.run(
                    "upgrade",
                    release,
                    str(chart),
                    "--namespace",
                    namespace,
                    "--values",
                    str(values_path),
                    "--output",
                    "json",
                )
            )
        )

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
