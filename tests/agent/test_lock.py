"""The image's dependency locks (ci/lock-deps) agree with pyproject.toml: every dependency and
build requirement is pinned there to a version its specifier allows, every pin carries hashes,
nothing pyproject.toml no longer asks for is still locked as asked for, and the Dockerfile
installs exactly these files in hash-checking mode."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)")
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}\b")


@dataclass
class Pin:
    version: str
    hashes: int = 0
    via: set[str] = field(default_factory=set)


def read_lock(path: Path) -> dict[str, Pin]:
    """name -> Pin of a pip-compile --generate-hashes file (with its `# via` annotations)."""
    pins: dict[str, Pin] = {}
    current: Pin | None = None
    for line in path.read_text().splitlines():
        if match := PIN.match(line):
            current = pins.setdefault(canonicalize_name(match["name"]), Pin(match["version"]))
        elif current is not None and line.startswith("    --hash="):
            current.hashes += len(HASH.findall(line))
        elif current is not None and line.startswith("    #"):
            via = line.strip().lstrip("#").strip()
            via = via.removeprefix("via").strip()
            if via:
                current.via.add(via)
        elif line.startswith("#"):
            current = None
        elif line.strip():
            raise AssertionError(f"{path.name}: unexpected line {line!r}")
    return pins


def pyproject() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


LOCKS = {
    "requirements.lock": ("project", "dependencies", "istio-cni (pyproject.toml)"),
    "requirements-build.lock": (
        "build-system",
        "requires",
        "istio-cni (pyproject.toml::build-system.requires)",
    ),
}


@pytest.mark.parametrize("lock", LOCKS, ids=list(LOCKS))
def test_lock_pins_what_pyproject_asks_for(lock: str) -> None:
    table, key, origin = LOCKS[lock]
    wanted = [Requirement(r) for r in pyproject()[table][key]]  # type: ignore[index]
    pins = read_lock(ROOT / lock)
    problems = []
    for req in wanted:
        pin = pins.get(canonicalize_name(req.name))
        if pin is None:
            problems.append(f"{req} is not in {lock}")
        elif not req.specifier.contains(pin.version, prereleases=True):
            problems.append(f"{lock} pins {req.name}=={pin.version}, pyproject.toml wants {req}")
        elif origin not in pin.via:
            problems.append(f"{lock} has {req.name} only as a dependency of {sorted(pin.via)}")
    asked = {canonicalize_name(r.name) for r in wanted}
    stale = sorted(n for n, p in pins.items() if origin in p.via and n not in asked)
    problems += [
        f"{lock} still locks {n} for pyproject.toml, which no longer asks for it" for n in stale
    ]
    problems += [f"{lock}: {n}=={p.version} has no hash" for n, p in pins.items() if not p.hashes]
    orphans = sorted(n for n, p in pins.items() if not p.via)
    problems += [f"{lock}: {n} is pinned but needed by nothing" for n in orphans]
    assert not problems, "run ci/lock-deps:\n" + "\n".join(problems)


def test_every_locked_package_is_needed_by_something_locked_or_by_pyproject() -> None:
    for lock, (_, _, origin) in LOCKS.items():
        pins = read_lock(ROOT / lock)
        for name, pin in pins.items():
            needers = {canonicalize_name(v.split(" ")[0]) for v in pin.via if v != origin}
            assert origin in pin.via or needers & set(pins), (lock, name, pin.via)


def test_the_dockerfile_installs_the_locks_with_hashes_and_nothing_else_from_the_index() -> None:
    text = (ROOT / "Dockerfile").read_text()
    joined = text.replace("\\\n", " ")
    installs = [" ".join(m.split()) for m in re.findall(r"(?:pip|\$PIP) install[^&;\n]*", joined)]
    assert installs, "the Dockerfile runs no pip install"
    for lock in LOCKS:
        assert re.search(rf"^COPY .*\b{re.escape(lock)}\b", text, re.M), f"{lock} not copied"
        assert any(f"-r {lock}" in i and "--require-hashes" in i for i in installs), installs
    for cmd in installs:  # each install is hash-checked, or takes nothing from an index
        assert "--require-hashes" in cmd or "--no-index" in cmd, cmd
