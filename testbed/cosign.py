"""cosign (built by ci/setup-tools) as a user of a release runs it: a throwaway key pair, and
`cosign verify` / `cosign verify-attestation` against a registry whose CA is given.

    signer = Cosign.with_new_key(tmp_dir, ca_file=registry.ca_file)
    signer.env                                  # COSIGN_PASSWORD, for ci/release --cosign-key
    signer.verify("HOST/repo@sha256:...")       # the completed process; never raises
    signer.sbom("HOST/repo@sha256:...")         # the attested SPDX document
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed import parts

PASSWORD = "throwaway-release-key"
"""The password of the tests' key pairs (cosign refuses none on `generate-key-pair`)."""


@dataclass(frozen=True)
class Cosign:
    binary: Path
    key: Path
    public_key: Path
    home: Path
    ca_file: Path | None

    @classmethod
    def with_new_key(cls, directory: Path, *, ca_file: Path | None = None) -> Cosign:
        binary = parts.release_tool("cosign").require()
        directory.mkdir(parents=True, exist_ok=True)
        made = cls(binary, directory / "cosign.key", directory / "cosign.pub", directory, ca_file)
        done = made.run("generate-key-pair", "--output-key-prefix", str(directory / "cosign"))
        assert done.returncode == 0, done.stderr
        return made

    @property
    def env(self) -> dict[str, str]:
        """cosign's environment (ci/release's too): the key's password; TUF state in the key's
        dir, never the user's; the registry's CA trusted."""
        env = dict(os.environ, COSIGN_PASSWORD=PASSWORD, TUF_ROOT=str(self.home / "tuf"))
        if self.ca_file is not None:
            env["SSL_CERT_FILE"] = str(self.ca_file)
        return env

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.binary), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def verify(
        self, ref: str, *, public_key: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`cosign verify` with the public key (key-signed releases are in no transparency log)."""
        key = str(public_key or self.public_key)
        return self.run("verify", "--key", key, "--insecure-ignore-tlog", ref)

    def verify_attestation(self, ref: str) -> subprocess.CompletedProcess[str]:
        return self.run(
            "verify-attestation",
            "--key",
            str(self.public_key),
            "--insecure-ignore-tlog",
            "--type",
            "spdxjson",
            ref,
        )

    def sbom(self, ref: str) -> dict[str, Any]:
        """The SPDX document attested for `ref`, once its signature is verified."""
        done = self.verify_attestation(ref)
        assert done.returncode == 0, f"cosign verify-attestation {ref}:\n{done.stderr}"
        envelopes = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        assert len(envelopes) == 1, f"{len(envelopes)} SBOM attestations on {ref}"
        statement = json.loads(base64.b64decode(envelopes[0]["payload"]))
        assert statement["predicateType"] == "https://spdx.dev/Document", statement["predicateType"]
        subjects = {s["digest"]["sha256"] for s in statement["subject"]}
        assert subjects == {ref.rsplit("@sha256:", 1)[1]}, f"attested for {subjects}, not {ref}"
        predicate: dict[str, Any] = statement["predicate"]
        return predicate
