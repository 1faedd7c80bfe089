"""Certificates for the control plane, made with the openssl command line: a CA, the API
server's serving certificate, client identities, and the service-account signing key pair.
EC P-256 keys: quick to generate, accepted by etcd, kube-apiserver and Python's ssl."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.parts import SETUP_APT, MissingPartError

DAYS = "2"


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise MissingPartError(f"test bed part 'openssl' is missing; install it with {SETUP_APT}")
    proc = subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed in {cwd}: {proc.stderr.strip()}")


def _new_key(path: Path) -> None:
    _openssl(
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        str(path),
        cwd=path.parent,
    )
    path.chmod(0o600)


def make_ca(directory: Path, name: str = "testbed-ca") -> KeyPair:
    ca = KeyPair(directory / "ca.crt", directory / "ca.key")
    _new_key(ca.key)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        str(ca.key),
        "-out",
        str(ca.cert),
        "-days",
        DAYS,
        "-subj",
        f"/CN={name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )
    return ca


def issue(
    ca: KeyPair,
    directory: Path,
    stem: str,
    *,
    common_name: str,
    organizations: Sequence[str] = (),
    server_names: Sequence[str] = (),
    server_ips: Sequence[str] = (),
) -> KeyPair:
    """A leaf certificate signed by `ca`: a server certificate when names or IPs are given,
    otherwise a client certificate (the Kubernetes user is CN, its groups are O)."""
    pair = KeyPair(directory / f"{stem}.crt", directory / f"{stem}.key")
    csr = directory / f"{stem}.csr"
    ext = directory / f"{stem}.ext"
    _new_key(pair.key)
    subject = "".join(f"/O={o}" for o in organizations) + f"/CN={common_name}"
    _openssl(
        "req", "-new", "-key", str(pair.key), "-out", str(csr), "-subj", subject, cwd=directory
    )
    lines = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
    ]
    sans = [f"DNS:{n}" for n in server_names] + [f"IP:{ip}" for ip in server_ips]
    if sans:
        lines += ["extendedKeyUsage=serverAuth,clientAuth", "subjectAltName=" + ",".join(sans)]
    else:
        lines += ["extendedKeyUsage=clientAuth"]
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca.cert),
        "-CAkey",
        str(ca.key),
        "-CAcreateserial",
        "-out",
        str(pair.cert),
        "-days",
        DAYS,
        "-extfile",
        str(ext),
        cwd=directory,
    )
    csr.unlink()
    ext.unlink()
    return pair


def make_signing_key(directory: Path, stem: str = "sa") -> KeyPair:
    """The service-account token signing key (private) and its public half (in `cert`)."""
    pair = KeyPair(directory / f"{stem}.pub", directory / f"{stem}.key")
    _new_key(pair.key)
    _openssl("pkey", "-in", str(pair.key), "-pubout", "-out", str(pair.cert), cwd=directory)
    return pair
