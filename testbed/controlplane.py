"""etcd, kube-apiserver and kube-controller-manager on loopback, with generated certificates.

The controller manager runs only the controllers an API server alone cannot do without:
`serviceaccount` (each namespace gets its `default` ServiceAccount, which pod admission needs),
`namespace` (a deleted namespace is emptied and goes away) and `garbagecollector` (owner
references). There is no scheduler and no kubelet: tests bind pods to the simulated node.

For a real node (testbed/realnode.py) the same control plane also listens on an address a
node network namespace reaches (`address`), runs kube-scheduler and the controllers a kubelet's
pods need (NODE_CONTROLLERS), and holds a client certificate to reach kubelets (pod logs).
"""

from __future__ import annotations

import http.client
import shutil
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from testbed import parts, pki
from testbed.kubeconfig import write_kubeconfig
from testbed.ports import free_port
from testbed.process import Daemon, PartFailedError

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service: first address of SERVICE_CIDR
ISSUER = "https://kubernetes.default.svc.cluster.local"
CONTROLLERS = "serviceaccount,namespace,garbagecollector"
# daemonset: the chart's DaemonSet gets its pod; nodelifecycle: lifts the not-ready taint the API
# server puts on a new Node once its kubelet reports Ready (its NoExecute evictions are a separate
# controller, left off so a restarting node keeps its pods); root-ca-cert-publisher: every
# namespace's kube-root-ca.crt, which the kubelet projects into each pod with its token;
# deployment, replicaset: a Deployment created plainly gets its pods (what istiod's injector sees).
NODE_CONTROLLERS = (
    CONTROLLERS + ",daemonset,nodelifecycle,root-ca-cert-publisher,deployment,replicaset"
)
PORT_ATTEMPTS = 3
T = TypeVar("T")


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path | None = None
    """Started only when set (a real node's pods need scheduling)."""

    @classmethod
    def from_cache(cls, *, scheduler: bool = False, kube: parts.Kube | None = None) -> Binaries:
        """The built parts of `kube` (the test bed's release by default); raises
        MissingPartError naming the first one missing."""
        kube = kube or parts.kube()
        return cls(
            etcd=parts.etcd().require(),
            kube_apiserver=kube.part("kube-apiserver").require(),
            kube_controller_manager=kube.part("kube-controller-manager").require(),
            kube_scheduler=kube.part("kube-scheduler").require() if scheduler else None,
        )


class ControlPlane:
    """Start with start(), always stop() (idempotent). `workdir` is removed by stop() except
    the component logs, which stay for post-mortems."""

    def __init__(
        self,
        workdir: Path,
        binaries: Binaries,
        *,
        ready_timeout: float = 120.0,
        port_source: Callable[[], int] = free_port,
        address: str = "127.0.0.1",
        controllers: str = CONTROLLERS,
        kubelet_client: bool = False,
        audit_policy: str = "",
        etcd_fsync: bool = True,
    ) -> None:
        """`audit_policy`: an audit Policy (YAML) for kube-apiserver's audit log (`audit_log`,
        one JSON event a line, written as each request is answered); `etcd_fsync=False`: etcd
        does not sync its log to disk (a test bed loaded with many objects fast, nothing kept)."""
        self.workdir = workdir
        self.audit_policy = audit_policy
        self.etcd_fsync = etcd_fsync
        self.address = address
        """Where kube-apiserver listens and every client reaches it."""
        self.controllers = controllers
        self.kubelet_client = kubelet_client
        """Give kube-apiserver a client certificate for kubelets (logs, exec)."""
        self.port_source = port_source
        self.binaries = binaries
        self.ready_timeout = ready_timeout
        self.pki_dir = workdir / "pki"
        self.data_dir = workdir / "etcd-data"
        self.log_dir = workdir / "logs"
        self.port = 0
        self.server = ""
        self.ca_file = self.pki_dir / "ca.crt"
        self.kubeconfig = workdir / "admin.kubeconfig"
        self.audit_log = self.log_dir / "audit.log"
        self.daemons: list[Daemon] = []
        self._admin: pki.KeyPair | None = None
        self.ca: pki.KeyPair | None = None
        """The cluster CA (also signs kubelet certificates); set by start()."""
        self.timings: dict[str, float] = {}
        """Seconds from start() until each part was ready (for the benchmark)."""

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        for d in (self.pki_dir, self.data_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)  # etcd refuses a data dir others can read
        began = time.monotonic()
        certs = self._make_pki()
        self.timings["certificates"] = time.monotonic() - began
        etcd_url = self._retry_port_clash(self._start_etcd)
        self.timings["etcd healthy"] = time.monotonic() - began
        self._retry_port_clash(lambda: self._start_apiserver(etcd_url, certs))
        self.timings["kube-apiserver /readyz"] = time.monotonic() - began
        self._start_controller_manager(certs)
        self.timings["kube-controller-manager"] = time.monotonic() - began
        if self.binaries.kube_scheduler is not None:
            self._start_scheduler(certs)
            self.timings["kube-scheduler"] = time.monotonic() - began

    def stop(self) -> None:
        """Stop every process (reverse order) and delete the data and keys, keep the logs."""
        for daemon in reversed(self.daemons):
            daemon.stop()
        self.daemons.clear()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        shutil.rmtree(self.pki_dir, ignore_errors=True)
        for f in self.workdir.glob("*.kubeconfig"):
            f.unlink(missing_ok=True)

    def _retry_port_clash(self, start: Callable[[], T]) -> T:
        """Run a part's start; when another process took its free port between our probe and
        its bind, start it again on new ports."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                return start()
            except PartFailedError as e:
                if not e.port_clash or attempt == PORT_ATTEMPTS:
                    raise
                failed = self.daemons.pop()
                failed.stop()
                failed.log_path.rename(failed.log_path.with_suffix(f".{attempt}.log"))
                if failed.name == "etcd":  # it may have begun its data dir
                    shutil.rmtree(self.data_dir)
                    self.data_dir.mkdir(mode=0o700)
        raise AssertionError("unreachable")

    # -- parts -------------------------------------------------------------------------------

    def _make_pki(self) -> dict[str, pki.KeyPair]:
        ca = pki.make_ca(self.pki_dir)
        certs = {
            "ca": ca,
            "serving": pki.issue(
                ca,
                self.pki_dir,
                "apiserver",
                common_name="kube-apiserver",
                server_names=[
                    "localhost",
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                ],
                server_ips=sorted({"127.0.0.1", self.address, SERVICE_IP}),
            ),
            "admin": pki.issue(
                ca,
                self.pki_dir,
                "admin",
                common_name="testbed-admin",
                organizations=["system:masters"],
            ),
            "controller-manager": pki.issue(
                ca, self.pki_dir, "controller-manager", common_name="system:kube-controller-manager"
            ),
            "sa": pki.make_signing_key(self.pki_dir),
        }
        if self.binaries.kube_scheduler is not None:
            certs["scheduler"] = pki.issue(
                ca, self.pki_dir, "scheduler", common_name="system:kube-scheduler"
            )
        if self.kubelet_client:
            # system:masters: kubelets here authorize every client their CA vouches for anyway.
            certs["kubelet-client"] = pki.issue(
                ca,
                self.pki_dir,
                "kubelet-client",
                common_name="kube-apiserver-kubelet-client",
                organizations=["system:masters"],
            )
        self._admin = certs["admin"]
        self.ca = ca
        return certs

    def _daemon(self, name: str, argv: list[str]) -> Daemon:
        daemon = Daemon(name, argv, self.log_dir / f"{name}.log")
        self.daemons.append(daemon)  # registered before start so stop() always sees it
        daemon.start()
        return daemon

    def _start_etcd(self) -> str:
        client, peer = self.port_source(), self.port_source()
        url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        etcd = self._daemon(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name=testbed",
                f"--data-dir={self.data_dir}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=testbed={peer_url}",
                "--initial-cluster-state=new",
                "--log-level=warn",
                *([] if self.etcd_fsync else ["--unsafe-no-fsync"]),
            ],
        )
        deadline = time.monotonic() + self.ready_timeout
        while not _etcd_healthy(client):
            if not etcd.alive():
                raise etcd.failure("exited before it was healthy")
            if time.monotonic() > deadline:
                raise etcd.failure(f"was not healthy at {url}/health within {self.ready_timeout}s")
            time.sleep(0.2)
        return url

    def _start_apiserver(self, etcd_url: str, certs: dict[str, pki.KeyPair]) -> None:
        self.port = self.port_source()
        self.server = f"https://{self.address}:{self.port}"
        kubelet_flags = []
        if "kubelet-client" in certs:
            kubelet_flags = [
                f"--kubelet-client-certificate={certs['kubelet-client'].cert}",
                f"--kubelet-client-key={certs['kubelet-client'].key}",
                f"--kubelet-certificate-authority={certs['ca'].cert}",
                "--kubelet-preferred-address-types=InternalIP",
            ]
        audit_flags = []
        if self.audit_policy:
            policy = self.workdir / "audit-policy.yaml"
            policy.write_text(self.audit_policy)
            audit_flags = [
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",  # in the log once answered: tests read it then
            ]
        apiserver = self._daemon(
            "kube-apiserver",
            [
                str(self.binaries.kube_apiserver),
                f"--etcd-servers={etcd_url}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--secure-port={self.port}",
                f"--cert-dir={self.pki_dir}",
                f"--tls-cert-file={certs['serving'].cert}",
                f"--tls-private-key-file={certs['serving'].key}",
                f"--client-ca-file={certs['ca'].cert}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-issuer={ISSUER}",
                f"--service-account-key-file={certs['sa'].cert}",
                f"--service-account-signing-key-file={certs['sa'].key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # The agent DaemonSet is privileged; without this its pod template is rejected.
                "--allow-privileged=true",
                "--profiling=false",
                # The `kubernetes` Service cannot point at a loopback address, and no pod here
                # needs it: do not keep trying.
                "--endpoint-reconciler-type=none",
                *kubelet_flags,
                *audit_flags,
            ],
        )
        self.kubeconfig = write_kubeconfig(
            self.workdir / "admin.kubeconfig",
            server=self.server,
            ca_file=self.ca_file,
            user="testbed-admin",
            client_cert=certs["admin"].cert,
            client_key=certs["admin"].key,
        )
        deadline = time.monotonic() + self.ready_timeout
        last = ""
        while True:
            if not apiserver.alive():
                raise apiserver.failure("exited before /readyz was ok")
            ok, last = self.readyz()
            if ok:
                return
            if time.monotonic() > deadline:
                raise apiserver.failure(
                    f"was not ready at {self.server}/readyz within {self.ready_timeout}s "
                    f"(last answer: {last})"
                )
            time.sleep(0.3)

    def _start_controller_manager(self, certs: dict[str, pki.KeyPair]) -> None:
        kubeconfig = write_kubeconfig(
            self.workdir / "controller-manager.kubeconfig",
            server=self.server,
            ca_file=self.ca_file,
            user="system:kube-controller-manager",
            client_cert=certs["controller-manager"].cert,
            client_key=certs["controller-manager"].key,
        )
        manager = self._daemon(
            "kube-controller-manager",
            [
                str(self.binaries.kube_controller_manager),
                f"--kubeconfig={kubeconfig}",
                f"--controllers={self.controllers}",
                "--leader-elect=false",
                # Each controller as its own ServiceAccount, with the bootstrap RBAC roles that
                # grant it (e.g. the namespace controller's deletecollection everywhere).
                "--use-service-account-credentials=true",
                "--bind-address=127.0.0.1",
                "--secure-port=0",  # nothing scrapes it; no port to race for
                f"--service-account-private-key-file={certs['sa'].key}",
                f"--root-ca-file={certs['ca'].cert}",
            ],
        )
        # Ready when it has done its first job: the default ServiceAccount of `default`.
        deadline = time.monotonic() + self.ready_timeout
        while self._get("/api/v1/namespaces/default/serviceaccounts/default")[0] != 200:
            if not manager.alive():
                raise manager.failure("exited before it created the default ServiceAccount")
            if time.monotonic() > deadline:
                raise manager.failure(
                    f"did not create the default ServiceAccount within {self.ready_timeout}s"
                )
            time.sleep(0.3)

    def _start_scheduler(self, certs: dict[str, pki.KeyPair]) -> None:
        assert self.binaries.kube_scheduler is not None
        kubeconfig = write_kubeconfig(
            self.workdir / "scheduler.kubeconfig",
            server=self.server,
            ca_file=self.ca_file,
            user="system:kube-scheduler",
            client_cert=certs["scheduler"].cert,
            client_key=certs["scheduler"].key,
        )
        scheduler = self._daemon(
            "kube-scheduler",
            [
                str(self.binaries.kube_scheduler),
                f"--kubeconfig={kubeconfig}",
                # Its API access is checked by the API server's RBAC, not delegated: no lookups
                # of the extension-apiserver-authentication ConfigMap needed.
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=0",  # nothing scrapes it; no port to race for
            ],
        )
        # No health endpoint is served (secure-port 0): pods being bound is its proof of life,
        # and whoever waits for that names this daemon's log when it exited.
        if not scheduler.alive():
            raise scheduler.failure("exited at start")

    # -- access ------------------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        """TLS to the API server as the admin identity."""
        if self._admin is None:
            raise RuntimeError("control plane not started")
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(self._admin.cert), str(self._admin.key))
        return ctx

    def get(self, path: str) -> tuple[int, str]:
        """GET `path` as the admin: (status, the first 4 KiB of the body); (0, why) when the
        API server gave no answer."""
        return self._get(path)

    def _get(self, path: str) -> tuple[int, str]:
        conn = http.client.HTTPSConnection(
            self.address, self.port, timeout=5, context=self.ssl_context()
        )
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read(4096).decode(errors="replace")
        except OSError as e:
            return 0, str(e)
        finally:
            conn.close()

    def readyz(self) -> tuple[bool, str]:
        """(GET /readyz is 200, the status and the end of the body)."""
        status, body = self._get("/readyz")
        return status == 200, f"{status} {body[-300:]}"


def _etcd_healthy(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        return resp.status == 200 and b'"true"' in resp.read()
    except OSError:
        return False
    finally:
        conn.close()
