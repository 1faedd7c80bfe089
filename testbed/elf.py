"""What an ELF file needs from the node: program interpreter, shared libraries, glibc versions.

Read with binutils' `readelf` (the plugin build needs binutils anyway), the way an operator would
check a binary before shipping it to old nodes.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

# The oldest glibc a node may have: RHEL/CentOS 7 and Amazon Linux 2 ship 2.17.
GLIBC_FLOOR = (2, 17)


@dataclass(frozen=True)
class ElfNeeds:
    path: Path
    interpreter: str | None
    libraries: tuple[str, ...]
    glibc: tuple[tuple[int, ...], ...]  # every GLIBC_x.y version it requires, sorted

    @property
    def newest_glibc(self) -> tuple[int, ...] | None:
        return self.glibc[-1] if self.glibc else None


def is_elf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


# e_machine (ELF header offset 18, little-endian on both) by the name `uname -m` gives.
_MACHINES = {62: "x86_64", 183: "aarch64"}


def machine(path: Path) -> str:
    """The machine an ELF file runs on, as `uname -m` names it (x86_64, aarch64)."""
    with open(path, "rb") as f:
        header = f.read(20)
    assert header[:4] == b"\x7fELF", f"{path} is not an ELF file"
    code = int.from_bytes(header[18:20], "little")
    return _MACHINES.get(code, f"e_machine {code}")


def elf_files(root: Path) -> list[Path]:
    """Every regular ELF file under root (or root itself when it is a file)."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return [p for p in files if not p.is_symlink() and is_elf(p)]


def _readelf(*args: str) -> str:
    done = subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"readelf {' '.join(args)}: {done.stderr}"
    return done.stdout


def needs(path: Path) -> ElfNeeds:
    program = _readelf("--program-headers", str(path))
    interp = re.search(r"Requesting program interpreter: ([^\]]+)\]", program)
    dynamic = _readelf("--dynamic", str(path))
    libraries = tuple(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))
    # Only the "Version needs" section: what the file requires, not what it defines.
    info = _readelf("--version-info", str(path))
    required = info.split("Version needs section", 1)[1] if "Version needs section" in info else ""
    required = re.split(r"\n\S", required, maxsplit=1)[0] if required else ""
    versions = {
        tuple(int(n) for n in v.split("."))
        for v in re.findall(r"Name: GLIBC_(\d+(?:\.\d+)+)", required)
    }
    return ElfNeeds(path, interp.group(1) if interp else None, libraries, tuple(sorted(versions)))


def too_new(root: Path, floor: tuple[int, ...] = GLIBC_FLOOR) -> list[str]:
    """One line per ELF file under root that needs a glibc newer than `floor`."""
    out = []
    for path in elf_files(root):
        newest = needs(path).newest_glibc
        if newest is not None and newest > floor:
            out.append(f"{path}: needs GLIBC_{'.'.join(map(str, newest))}")
    return out
