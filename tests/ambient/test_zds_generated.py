"""The committed ZDS messages are what protoc makes of the committed zds.proto (ci/gen-zds), and
the protobuf lower bound in pyproject.toml is the version that generated code asks for."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("zds_pb2.py", "zds_pb2.pyi")


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("zds")
    done = subprocess.run(
        [str(ROOT / "ci/gen-zds"), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        check=False,
    )
    assert done.returncode == 0, f"ci/gen-zds failed: {done.stderr}"
    return out


@pytest.mark.parametrize("name", GENERATED)
def test_committed_code_is_regenerated_unchanged(regenerated: Path, name: str) -> None:
    committed = (ROOT / "agent/ambient" / name).read_text()
    assert (regenerated / name).read_text() == committed, (
        f"agent/ambient/{name} is not what ci/gen-zds makes of zds.proto: run ci/gen-zds"
    )


def test_protobuf_lower_bound_matches_the_generated_code() -> None:
    header = (ROOT / "agent/ambient/zds_pb2.py").read_text()
    made_for = re.search(r"# Protobuf Python Version: (\S+)", header)
    assert made_for is not None
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    protobuf = [d for d in dependencies if d.startswith("protobuf")]
    major = made_for.group(1).split(".")[0]
    assert protobuf == [f"protobuf>={made_for.group(1)},<{int(major) + 1}"]


def test_proto_is_istios_with_an_origin_header() -> None:
    text = (ROOT / "agent/ambient/zds.proto").read_text()
    assert text.startswith("// Origin: istio.io/istio pkg/zdsapi/zds.proto")
    assert "package istio.workload.zds;" in text
    assert "Licensed under the Apache License, Version 2.0" in text
