"""Freeze the plugin and the standard-library modules it imports into a C file.

Run by ci/build-plugin with the plugin's own static interpreter (ci/plugin/build-python), so the
marshal format is exactly the one the executable reads and the built-in module set is exactly the
one it has:

    python -S -X frozen_modules=on freeze.py find REPO STDLIB > modules.tsv
    python -S -X frozen_modules=on freeze.py emit modules.tsv frozen.c

`find` walks the plugin's imports statically (modulefinder) and lists every pure-Python module
the executable needs (name, source, is-package), leaving out the modules the interpreter already
has frozen in (os, io, codecs, abc, stat, posixpath, ...). It fails when the plugin imports
anything outside the standard library or an extension module the interpreter does not have built
in. `emit` runs in a fresh process that imports nothing else, so marshal's output (which depends
on the interpreter's state: reference counts decide its back-references) is the same on every
build: it compiles each source and writes a `struct _frozen` table, `istio_cni_frozen`, for
PyImport_FrozenModules.
"""

from __future__ import annotations

import sys

# Needed at run time but invisible to a static scan: codecs are looked up by name.
EXTRA = ("encodings", "plugin.main")
# Imported somewhere in the closure (often under TYPE_CHECKING or on paths the plugin never
# takes) but never at run time; leaving them out keeps the executable small. The build's tests
# run the built plugin through every command, so a module wrongly listed here fails them.
EXCLUDE = (
    "_pydecimal",
    "argparse",
    "ast",
    "asyncio",
    "base64",
    "bz2",
    "concurrent",
    "csv",
    "ctypes",
    "curses",
    "dataclasses",
    "decimal",
    "difflib",
    "dis",
    "doctest",
    "email",
    "fractions",
    "getopt",
    "gettext",
    "gzip",
    "hashlib",
    "http",
    "inspect",
    "logging",
    "lzma",
    "multiprocessing",
    "pathlib",
    "pdb",
    "pickle",
    "pkgutil",
    "pprint",
    "py_compile",
    "pydoc",
    "quopri",
    "random",
    "readline",
    "shutil",
    "signal",
    "sqlite3",
    "ssl",
    "statistics",
    "string",
    "stringprep",
    "subprocess",
    "tarfile",
    "tempfile",
    "threading",
    "tkinter",
    "tracemalloc",
    "typing",
    "unicodedata",
    "unittest",
    "urllib",
    "xml",
    "zipfile",
    "zipimport",
)
# Codecs needing extension modules (CJK, zlib, unicodedata...): the plugin runs in UTF-8 mode.
SKIP_CODECS = (
    "big5",
    "cp932",
    "cp949",
    "cp950",
    "euc_",
    "gb",
    "hz",
    "iso2022",
    "johab",
    "shift_jis",
    "idna",
    "punycode",
    "zlib_codec",
    "bz2_codec",
    "base64_codec",
    "hex_codec",
    "uu_codec",
    "quopri_codec",
    "mbcs",
    "oem",
)


def find(repo: str, stdlib: str) -> int:
    """Print `name<TAB>source<TAB>0|1` for every module to freeze, sorted by name."""
    import _imp
    import modulefinder
    import os

    finder = modulefinder.ModuleFinder(path=[repo, stdlib], excludes=list(EXCLUDE))
    finder.run_script(os.path.join(repo, "plugin", "main.py"))
    for name in EXTRA:
        finder.import_hook(name)
    for entry in sorted(os.listdir(os.path.join(stdlib, "encodings"))):
        stem, ext = os.path.splitext(entry)
        if ext == ".py" and stem != "__init__" and not stem.startswith(SKIP_CODECS):
            finder.import_hook(f"encodings.{stem}")
    missing = sorted(
        m
        for m in finder.badmodules
        if m.split(".")[0] not in EXCLUDE and _imported_by_plugin(finder, m)
    )
    if missing:
        print(
            f"freeze: the plugin imports modules this interpreter does not have: {missing} "
            "(pure Python outside the standard library, or an extension module missing "
            "from ci/plugin/Setup.local)",
            file=sys.stderr,
        )
        return 1
    repo_plugin = os.path.join(os.path.realpath(repo), "plugin") + os.sep
    stdlib_real = os.path.realpath(stdlib) + os.sep
    for name, mod in sorted(finder.modules.items()):
        path: str | None = getattr(mod, "__file__", None)
        if name == "__main__" or not path or _imp.is_frozen(name):
            continue  # built in, or already frozen into the interpreter
        src = os.path.realpath(path)
        if (
            not (src.startswith(stdlib_real) or src.startswith(repo_plugin))
            or "site-packages" in src
            or not src.endswith(".py")
        ):
            print(
                f"freeze: {name} comes from {src}: the plugin may use the standard library only",
                file=sys.stderr,
            )
            return 1
        print(f"{name}\t{src}\t{int(getattr(mod, '__path__', None) is not None)}")
    return 0


def _imported_by_plugin(finder: object, missing: str) -> bool:
    """True when a plugin module itself imports `missing` (not some unused stdlib corner)."""
    who: dict[str, int] = finder.badmodules[missing]  # type: ignore[attr-defined]
    return any(w.startswith("plugin") or w == "__main__" for w in who)


def emit(listing: str, out: str) -> int:
    """Compile and marshal every listed module into a C table, byte for byte reproducibly."""
    import marshal

    with open(listing, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    lines = [
        "/* Generated by ci/plugin/freeze.py: the plugin and the standard-library modules",
        " * it imports, as marshalled code objects. Do not edit. */",
        "#include <Python.h>",
        "",
    ]
    table = []
    for i, (name, src, is_pkg) in enumerate(rows):
        with open(src, "rb") as f:
            source = f.read()
        code = compile(source, f"<frozen {name}>", "exec", dont_inherit=True, optimize=0)
        data = marshal.dumps(code)
        lines.append(f"static const unsigned char m{i}[{len(data)}] = {{")
        for at in range(0, len(data), 24):
            lines.append(",".join(str(b) for b in data[at : at + 24]) + ",")
        lines.append("};")
        table.append(f'    {{"{name}", m{i}, {len(data)}, {int(is_pkg)}, NULL}},')
    lines += [
        "",
        "const struct _frozen istio_cni_frozen[] = {",
        *table,
        "    {NULL, NULL, 0, 0, NULL},",
        "};",
        "",
    ]
    with open(out, "w", encoding="ascii") as f:
        f.write("\n".join(lines))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[1] == "find":
        return find(argv[2], argv[3])
    if len(argv) == 4 and argv[1] == "emit":
        return emit(argv[2], argv[3])
    print("usage: freeze.py find REPO STDLIB | emit LISTING OUT.c", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
