"""Lay out the plugin's support directory: libpython, the stdlib modules it uses, the plugin.

Run by ci/build-plugin with the Python that is embedded (isolated mode):
    python -I assemble.py REPO STAGE
STAGE receives lib/libpython3.X.so.1.0, lib/python/ (sourceless .pyc of the plugin and of the
standard library modules its imports reach, found statically) and lib/lib-dynload/ (the
extension modules among them). Prints the content hash of STAGE. Fails when the plugin imports
anything outside the standard library.
"""

from __future__ import annotations

import hashlib
import modulefinder
import os
import py_compile
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

# Needed at run time but invisible to a static scan: codecs are looked up by name.
EXTRA = ("encodings", "plugin.main")
# Imported somewhere in the closure (often under TYPE_CHECKING or on paths the plugin never
# takes) but never at run time; leaving them out keeps the support dir small. The build's tests
# run the built plugin through every command, so a module wrongly listed here fails them.
EXCLUDE = (
    "_pydecimal", "argparse", "ast", "asyncio", "base64", "bz2", "concurrent", "csv", "ctypes",
    "curses", "dataclasses", "decimal", "difflib", "dis", "doctest", "email", "fractions",
    "getopt", "gettext", "gzip", "hashlib", "http", "inspect", "logging", "lzma",
    "multiprocessing", "pathlib", "pdb", "pickle", "pkgutil", "pprint", "py_compile", "pydoc",
    "quopri", "random", "readline", "shutil", "signal", "sqlite3", "ssl", "statistics",
    "string", "stringprep", "subprocess", "tarfile", "tempfile", "threading", "tkinter",
    "tracemalloc", "typing", "unicodedata", "unittest", "urllib", "xml", "zipfile", "zipimport",
)
# Codecs needing extension modules (CJK, zlib, unicodedata...): the launcher runs in UTF-8 mode.
SKIP_CODECS = ("big5", "cp932", "cp949", "cp950", "euc_", "gb", "hz", "iso2022", "johab",
               "shift_jis", "idna", "punycode", "zlib_codec", "bz2_codec", "base64_codec",
               "hex_codec", "uu_codec", "quopri_codec", "mbcs", "oem")


def main() -> int:
    repo, stage = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    dynload = Path(sysconfig.get_paths()["platstdlib"]).resolve() / "lib-dynload"
    finder = modulefinder.ModuleFinder(path=[str(repo), str(stdlib), str(dynload)],
                                       excludes=list(EXCLUDE))
    finder.run_script(str(repo / "plugin" / "main.py"))
    for name in EXTRA:
        finder.import_hook(name)
    for name in ("encodings",):
        for mod in sorted((stdlib / name).glob("*.py")):
            if not mod.stem.startswith(SKIP_CODECS):
                finder.import_hook(f"{name}.{mod.stem}")
    if finder.badmodules:
        missing = sorted(m for m in finder.badmodules
                         if m.split(".")[0] not in EXCLUDE and _is_plugin_dependency(finder, m))
        if missing:
            print(f"assemble: plugin imports modules that are not there: {missing}",
                  file=sys.stderr)
            return 1
    py_dir, so_dir = stage / "lib" / "python", stage / "lib" / "lib-dynload"
    for name, mod in sorted(finder.modules.items()):
        if name == "__main__" or not mod.__file__:
            continue
        src = Path(mod.__file__).resolve()
        if src.suffix == ".so":
            so_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, so_dir / src.name)
            continue
        root = repo if src.is_relative_to(repo / "plugin") else stdlib
        if (root is stdlib and not src.is_relative_to(stdlib)) or "site-packages" in src.parts:
            print(f"assemble: {name} comes from {src}: the plugin may use the standard "
                  "library only", file=sys.stderr)
            return 1
        rel = src.relative_to(root)
        dest = py_dir / rel.with_suffix(".pyc")
        dest.parent.mkdir(parents=True, exist_ok=True)
        py_compile.compile(str(src), cfile=str(dest), dfile=str(rel), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    _copy_libpython(stage / "lib")
    print(content_hash(stage))
    return 0


def _is_plugin_dependency(finder: modulefinder.ModuleFinder, missing: str) -> bool:
    """True when a plugin module itself imports `missing` (not some unused stdlib corner)."""
    return any(who.startswith("plugin") or who == "__main__"
               for who in finder.badmodules[missing])


def _copy_libpython(lib: Path) -> None:
    soname = sysconfig.get_config_var("INSTSONAME")
    src = Path(sysconfig.get_config_var("LIBDIR")) / soname
    lib.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, lib / soname)
    # Debug symbols are most of libpython's size; the plugin needs none of them.
    subprocess.run(["strip", "--strip-unneeded", str(lib / soname)], check=True)
    for so in (lib / "lib-dynload").glob("*.so"):
        subprocess.run(["strip", "--strip-unneeded", str(so)], check=True)


def content_hash(stage: Path) -> str:
    """sha256 over every file's relative path, mode and bytes: names the support dir."""
    digest = hashlib.sha256()
    for path in sorted(p for p in stage.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(stage)).encode() + b"\0")
        digest.update(b"x" if os.access(path, os.X_OK) else b"-")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


if __name__ == "__main__":
    sys.exit(main())
