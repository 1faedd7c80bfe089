"""Where the API server is and who the agent is to it: in a pod its ServiceAccount, elsewhere
(tests, a developer's machine) the kubeconfig file $KUBECONFIG names.

    in a pod       KUBERNETES_SERVICE_HOST/PORT, the token and CA kubelet projects under
                   /var/run/secrets/kubernetes.io/serviceaccount (the token re-read as kubelet
                   rotates it)
    a kubeconfig   its current context: `server`, `certificate-authority(-data)` or
                   `insecure-skip-tls-verify`, and a `token`, `tokenFile` or a client
                   certificate and key (files or `-data`)

The credentials are never logged; `Configuration` has no repr of them.
"""

from __future__ import annotations

import base64
import contextlib
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent.errors import ConfigError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_SECONDS = 60.0
"""How long a read token is used before the file is read again (client-go's period)."""
TOKEN_RETRY_SECONDS = 5.0
"""After a 401, the file is read again at once, but not more often than this: a token the
API server refuses (revoked, or signed by a rotated key) is replaced as soon as kubelet writes
the new one, without reading the file on every refused call."""


class TokenSource:
    """A bearer token: fixed, or from a file read again every TOKEN_REREAD_SECONDS, and at once
    after a 401 (`refresh`), as client-go's cached token source drops a token refused."""

    def __init__(self, token: str = "", path: Path | None = None) -> None:
        self._token, self._path = token, path
        self._read_at = 0.0
        self._forced_at = -TOKEN_RETRY_SECONDS
        self._lock = threading.Lock()
        if path is not None:
            self._reread()

    def _reread(self) -> None:
        assert self._path is not None
        try:
            self._token = self._path.read_text().strip()
        except OSError as e:
            raise ConfigError(f"Kubernetes token {self._path}: {e.strerror or e}") from e
        self._read_at = time.monotonic()

    def __call__(self) -> str:
        if self._path is not None and time.monotonic() - self._read_at >= TOKEN_REREAD_SECONDS:
            # A failed read keeps the last token: the API server tells whether it still counts.
            with self._lock, contextlib.suppress(ConfigError):
                self._reread()
        return self._token

    def refresh(self) -> bool:
        """The API server refused the token (401): read the file again now, unless it was
        forced less than TOKEN_RETRY_SECONDS ago. True when the token changed."""
        if self._path is None:
            return False
        with self._lock:
            now = time.monotonic()
            if now - self._forced_at < TOKEN_RETRY_SECONDS:
                return False
            self._forced_at, before = now, self._token
            with contextlib.suppress(ConfigError):
                self._reread()
            return self._token != before

    def __repr__(self) -> str:
        return "TokenSource(<redacted>)"


@dataclass(frozen=True)
class Configuration:
    host: str
    """The API server's URL, https://host:port."""
    ssl_context: ssl.SSLContext = field(repr=False)
    token: TokenSource | None = field(default=None, repr=False)
    source: str = ""
    """Where it came from, for the log."""


def load_configuration(environ: Mapping[str, str] | None = None) -> Configuration:
    """In a pod (KUBERNETES_SERVICE_HOST set) the ServiceAccount's, else $KUBECONFIG's."""
    env = os.environ if environ is None else environ
    if env.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster(env)
    path = env.get("KUBECONFIG", "")
    if not path:
        raise ConfigError(
            "Kubernetes client config: neither KUBERNETES_SERVICE_HOST nor KUBECONFIG is set"
        )
    try:
        return from_kubeconfig(Path(path))
    except ConfigError as e:
        raise ConfigError(f"Kubernetes client config {path}: {e}") from e


def in_cluster(env: Mapping[str, str], directory: Path = SERVICE_ACCOUNT_DIR) -> Configuration:
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not port:
        raise ConfigError("in-cluster Kubernetes config: KUBERNETES_SERVICE_PORT is not set")
    try:
        context = ssl.create_default_context(cafile=str(directory / "ca.crt"))
        token = TokenSource(path=directory / "token")
    except (OSError, ssl.SSLError, ConfigError) as e:
        raise ConfigError(f"in-cluster Kubernetes config: {e}") from e
    bracketed = f"[{host}]" if ":" in host else host
    return Configuration(
        f"https://{bracketed}:{port}", context, token, "in-cluster service account"
    )


def from_kubeconfig(path: Path) -> Configuration:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(e.strerror or str(e)) from e
    except yaml.YAMLError as e:
        raise ConfigError(f"not YAML: {str(e)[:200]}") from e
    if not isinstance(data, dict):
        raise ConfigError("not a kubeconfig")
    context = _named(data, "contexts", data.get("current-context"), "context")
    cluster = _named(data, "clusters", context.get("cluster"), "cluster")
    user = _named(data, "users", context.get("user"), "user")
    server = str(cluster.get("server") or "")
    if not server.startswith("https://"):
        raise ConfigError(f"cluster server {server!r} is not an https:// URL")
    try:
        ssl_context = _ssl_context(cluster, user, path.parent)
    except (OSError, ssl.SSLError, ValueError) as e:
        raise ConfigError(f"TLS: {e}") from e
    token = None
    if user.get("token"):
        token = TokenSource(str(user["token"]))
    elif user.get("tokenFile"):
        token = TokenSource(path=_relative(path.parent, str(user["tokenFile"])))
    return Configuration(server.rstrip("/"), ssl_context, token, str(path))


def _named(data: Mapping[str, Any], section: str, name: object, key: str) -> Mapping[str, Any]:
    for entry in data.get(section) or []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            found = entry.get(key)
            if isinstance(found, Mapping):
                return found
    raise ConfigError(f"no {key} named {name!r} in {section}")


def _relative(base: Path, name: str) -> Path:
    return Path(name) if os.path.isabs(name) else base / name


def _ssl_context(cluster: Mapping[str, Any], user: Mapping[str, Any], base: Path) -> ssl.SSLContext:
    if cluster.get("insecure-skip-tls-verify") is True:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif cluster.get("certificate-authority-data"):
        ca = base64.b64decode(str(cluster["certificate-authority-data"])).decode()
        context = ssl.create_default_context(cadata=ca)
    elif cluster.get("certificate-authority"):
        ca_file = _relative(base, str(cluster["certificate-authority"]))
        context = ssl.create_default_context(cafile=str(ca_file))
    else:
        context = ssl.create_default_context()
    cert, key = _pem(user, "client-certificate", base), _pem(user, "client-key", base)
    if cert and key:
        _load_client_pair(context, cert, key)
    return context


def _pem(user: Mapping[str, Any], name: str, base: Path) -> bytes:
    if user.get(f"{name}-data"):
        return base64.b64decode(str(user[f"{name}-data"]))
    if user.get(name):
        return _relative(base, str(user[name])).read_bytes()
    return b""


def _load_client_pair(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # ssl loads a certificate chain only from files: a private directory, removed at once.
    with tempfile.TemporaryDirectory(prefix="istio-cni-kube-") as tmp:
        cert_path, key_path = Path(tmp) / "client.crt", Path(tmp) / "client.key"
        for target, content in ((cert_path, cert), (key_path, key)):
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(content)
        context.load_cert_chain(str(cert_path), str(key_path))
