"""Istio's control plane beside the real node: Istio's own `base` and `istiod` charts installed by
Helm into the test bed's API server, and istiod (`pilot-discovery`) run on the host as the chart's
Deployment would run it in a pod.

    Istiod.start():
      serving certificate     a CA of its own; IP SAN 127.0.0.1 and the istiod Service's names
      namespace istio-system  then `helm install istio-base` and `helm install istiod`
                              (tests/testdata/istio-base-chart, tests/testdata/istiod-chart:
                              copies of the pinned istio.io/istio module's charts)
      the chart's Deployment  read back, then scaled to 0 (it is also kept off every node)
      istiod on the host      the Deployment's args and env, with the changes below; a token
                              kubeconfig of the chart's `istiod` ServiceAccount
      ready                   GET /ready on its HTTP port, and its webhook answering over TLS
    Istiod.stop(): the reverse; the webhooks, the releases, every `istio-ca-root-cert` ConfigMap
    istiod wrote and the namespace go, even when a step fails.

Why on the host: the API server runs on the host and calls the webhooks; the node's pod network
is not routed from there. What the test bed changes so that istiod runs out of a cluster:
- Webhooks: both point at the host process by URL, with the test bed CA as their caBundle:
  `istiodRemote.injectionURL` / `injectionCABundle` (the sidecar injector, /inject) and
  `base.validationURL` / `validationCABundle` (config validation, /validate), on the istiod chart
  and the base chart (its default-revision validator). istiod's own patcher writes the same CA
  into the injector's caBundle (it reads it from --caCertFile).
- Its serving certificate: --tlsCertFile, --tlsKeyFile, --caCertFile (istiod's "custom DNS
  certificate" path). Its Istio CA (the workload CA, `istio-ca-secret`) is its own, as in a cluster
  (but with `for_pods`, below).
- Listeners: every one on 127.0.0.1 and a free port (--httpAddr, --httpsAddr, --grpcAddr,
  --secureGRPCAddr, --monitoringAddr, --ctrlz_port), so two runs on one machine never meet.
- Identity: KUBECONFIG and --kubeconfig name a kubeconfig with a TokenRequest token of the chart's
  `istiod` ServiceAccount: istiod holds exactly the chart's RBAC. The downward-API env the kubelet
  would fill: POD_NAME (`istiod-host`), POD_NAMESPACE, SERVICE_ACCOUNT; resource fields (GOMAXPROCS)
  are left to Go's defaults. Every other env is the Deployment's own (PILOT_*, REVISION, CLUSTER_ID,
  PILOT_CERT_PROVIDER=istiod, ...), and nothing of the test's environment but PATH.
- Configuration: mesh config and injection templates come from the chart's ConfigMaps (`istio`,
  `istio-sidecar-injector`), as istiod reads them when its files are absent (its working dir is
  empty).
- The chart's Deployment: a nodeSelector no node has (`NOT_ON_ANY_NODE`), no autoscaler, then
  replicas 0; its image (`<hub>/pilot:<tag>`, pull policy Never) is never pulled.
Injected pods: `pilot.cni.enabled=true`, the setting Istio's docs name (the chart copies what is
under `pilot` to its top level, `cni.enabled`, and builds the injector's values from that), and
the test bed's proxy image (ci/build-testbed-images: Istio's pilot-agent with the Envoy double)
for istio-proxy and istio-validation: `global.hub`/`global.tag` of that image,
`global.proxy.image` and `global.proxy_init.image` `proxy`, `global.imagePullPolicy` Never. A pod
asks for the real Envoy under pilot-agent (the `proxy-envoy` image) with the injector's
`sidecar.istio.io/proxyImage` annotation (testbed/istio_sidecar.py).
Not set up: a pod cannot reach istiod (no XDS, no workload certificate): the Envoy double takes no
config, and pilot-agent's certificate requests find no resolver (the node has no DNS). With
`for_pods` on a node with Services (testbed/services.py) the secure gRPC port listens on the
root end of the node's link instead, its serving certificate names that address too, and an
EndpointSlice makes that listener the `istiod` Service's endpoint on 15012: pods reach it at
`istiod.istio-system.svc:15012`. It then also signs workload certificates with the test bed CA
(Istio's plug-in CA: the `cacerts` files, in its working dir's etc/cacerts), so one root, the
`istio-ca-root-cert` of every namespace, verifies istiod for pilot-agent and every workload
certificate for Envoy, as the single self-signed root of an install without custom certificates.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import shutil
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from testbed import pki
from testbed.helm import Helm
from testbed.identity import service_account_identity
from testbed.images import Image
from testbed.istio_binaries import pilot_discovery
from testbed.parts import REPO_ROOT
from testbed.ports import free_port
from testbed.process import Daemon, PartFailedError
from testbed.realnode import RealCluster
from testbed.services import put_endpoint_slice
from testbed.wait import wait_for

BASE_CHART = REPO_ROOT / "tests" / "testdata" / "istio-base-chart"
ISTIOD_CHART = REPO_ROOT / "tests" / "testdata" / "istiod-chart"
NAMESPACE = "istio-system"
BASE_RELEASE = "istio-base"
ISTIOD_RELEASE = "istiod"
DEPLOYMENT = "istiod"
SERVICE = "istiod"
SECURE_GRPC_PORT_NAME = "https-dns"  # the chart's Service port 15012
CONTAINER = "discovery"
POD_NAME = "istiod-host"
INJECTOR_WEBHOOK = "istio-sidecar-injector"
VALIDATING_WEBHOOKS = ("istio-validator-istio-system", "istiod-default-validator")
ROOT_CERT_CONFIGMAP = "istio-ca-root-cert"
NOT_ON_ANY_NODE = {"istio-cni.testbed/istiod": "runs-on-the-host"}
PROXY_IMAGE_NAME = "proxy"
READY_TIMEOUT = 120.0
TOKEN_SECONDS = 4 * 3600


@dataclass(frozen=True)
class Ports:
    """istiod's listeners, each on 127.0.0.1."""

    http: int
    https: int
    grpc: int
    secure_grpc: int
    monitoring: int
    ctrlz: int

    @classmethod
    def free(cls) -> Ports:
        return cls(*(free_port() for _ in fields(cls)))

    def flags(self, secure_grpc_host: str = "127.0.0.1") -> list[str]:
        return [
            f"--httpAddr=127.0.0.1:{self.http}",
            f"--httpsAddr=127.0.0.1:{self.https}",
            f"--grpcAddr=127.0.0.1:{self.grpc}",
            f"--secureGRPCAddr={secure_grpc_host}:{self.secure_grpc}",
            f"--monitoringAddr=127.0.0.1:{self.monitoring}",
            f"--ctrlz_port={self.ctrlz}",
            "--ctrlz_address=127.0.0.1",
        ]


def ca_bundle(ca: pki.KeyPair) -> str:
    """A webhook's caBundle value: the PEM, base64 (as Helm values and the API take it)."""
    return base64.b64encode(ca.cert.read_bytes()).decode()


def base_values(ports: Ports, ca: pki.KeyPair) -> dict[str, Any]:
    return {
        "global": {"istioNamespace": NAMESPACE},
        "base": {
            "validationURL": f"https://127.0.0.1:{ports.https}/validate",
            "validationCABundle": ca_bundle(ca),
        },
    }


def istiod_values(ports: Ports, ca: pki.KeyPair, proxy: Image) -> dict[str, Any]:
    return {
        "global": {
            "istioNamespace": NAMESPACE,
            "hub": proxy.hub,
            "tag": proxy.tag,
            "imagePullPolicy": "Never",
            "proxy": {"image": PROXY_IMAGE_NAME},
            "proxy_init": {"image": PROXY_IMAGE_NAME},
        },
        # The setting a user of this chart gives istiod: inject istio-validation, not istio-init.
        "pilot": {"cni": {"enabled": True}},
        "istiodRemote": {
            "injectionURL": f"https://127.0.0.1:{ports.https}/inject",
            "injectionCABundle": ca_bundle(ca),
        },
        "base": {
            "validationURL": f"https://127.0.0.1:{ports.https}/validate",
            "validationCABundle": ca_bundle(ca),
        },
        "autoscaleEnabled": False,
        "nodeSelector": NOT_ON_ANY_NODE,
    }


def host_env(container: Any, *, service_account: str, kubeconfig: Path) -> dict[str, str]:
    """The container's env as the kubelet would fill it, for a process on the host. A value
    source the test bed cannot fill fails, naming it, rather than being dropped unseen."""
    fieldpaths = {
        "metadata.name": POD_NAME,
        "metadata.namespace": NAMESPACE,
        "spec.serviceAccountName": service_account,
    }
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for var in container.env or []:
        source = var.value_from
        if source is None:
            env[var.name] = var.value or ""
        elif source.field_ref is not None and source.field_ref.field_path in fieldpaths:
            env[var.name] = fieldpaths[source.field_ref.field_path]
        elif source.resource_field_ref is not None:
            continue  # GOMAXPROCS from a CPU limit: no limit on the host, Go's default
        else:
            raise PartFailedError(
                f"istiod Deployment: env {var.name} comes from {source.to_dict()}, which the test "
                "bed does not fill for a process on the host"
            )
    env["KUBECONFIG"] = str(kubeconfig)
    return env


def merged(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `override` merged in as Helm merges values files: maps key by key, anything
    else (lists included) replaced."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


class Istiod:
    """start() then stop() (always; idempotent). `workdir/istiod.log` is istiod's log.

    `values` and `base_values` are merged over the test bed's values of the istiod and base
    charts (the test bed's own keys, the webhook URLs and CAs, win only where not overridden).
    start() is three steps, each public for a caller that installs Istio's charts its own way
    (say, as dependencies of a parent chart): make_certificates(), install_charts(),
    run_on_host() (which reads the `istiod` Deployment, whoever installed it)."""

    def __init__(
        self,
        cluster: RealCluster,
        helm: Helm,
        proxy: Image,
        workdir: Path,
        *,
        values: Mapping[str, Any] | None = None,
        base_values: Mapping[str, Any] | None = None,
        for_pods: bool = False,
    ) -> None:
        """`for_pods`: its secure gRPC port (15012, certificates and XDS over TLS) also for the
        node's pods, at the `istiod` Service (a node with Services, RealCluster(services=True))."""
        if for_pods and not cluster.services_enabled:
            raise ValueError("for_pods: the node routes no Services (RealCluster(services=True))")
        self.for_pods = for_pods
        self.cluster = cluster
        self.helm = helm
        self.proxy = proxy
        self.workdir = workdir
        self.values_override = dict(values or {})
        self.base_values_override = dict(base_values or {})
        self.binary = pilot_discovery().require()
        self.pki_dir = workdir / "pki"
        self.run_dir = workdir / "run"
        self.log_path = workdir / "istiod.log"
        self.ports = Ports.free()
        self.ca: pki.KeyPair | None = None
        self.serving: pki.KeyPair | None = None
        self.daemon: Daemon | None = None
        self._made_namespace = False

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self.make_certificates()
        self.install_charts()
        self.run_on_host()

    def make_certificates(self) -> None:
        """The CA the webhooks name and istiod's serving certificate (before any chart values:
        they carry the CA)."""
        for d in (self.pki_dir, self.run_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.ca = pki.make_ca(self.pki_dir, "testbed-istiod-ca")
        self.serving = pki.issue(
            self.ca,
            self.pki_dir,
            "istiod",
            common_name=f"istiod.{NAMESPACE}.svc",
            server_names=["istiod", f"istiod.{NAMESPACE}", f"istiod.{NAMESPACE}.svc"],
            server_ips=["127.0.0.1", *([self.pod_address] if self.for_pods else [])],
        )

    @property
    def pod_address(self) -> str:
        """Where the secure gRPC port listens for pods: the root end of the node's link, the
        machine's address the node reaches."""
        return self.cluster.network.gateway if self.for_pods else "127.0.0.1"

    def base_chart_values(self) -> dict[str, Any]:
        assert self.ca is not None, "make_certificates() first"
        return merged(base_values(self.ports, self.ca), self.base_values_override)

    def istiod_chart_values(self) -> dict[str, Any]:
        assert self.ca is not None, "make_certificates() first"
        return merged(istiod_values(self.ports, self.ca, self.proxy), self.values_override)

    def make_namespace(self) -> None:
        self.cluster.core().create_namespace({"metadata": {"name": NAMESPACE}})
        self._made_namespace = True

    def install_charts(self) -> None:
        """istio-system, then `helm install` of Istio's base and istiod charts."""
        self.make_namespace()
        self.helm.install(
            BASE_RELEASE, BASE_CHART, namespace=NAMESPACE, values=self.base_chart_values()
        )
        self.helm.install(
            ISTIOD_RELEASE, ISTIOD_CHART, namespace=NAMESPACE, values=self.istiod_chart_values()
        )

    def run_on_host(self) -> None:
        """istiod as the chart's Deployment would run it (its args and env, the changes the
        module docstring lists), on the host; then its Deployment scaled to 0; Ready."""
        assert self.ca is not None and self.serving is not None, "make_certificates() first"
        core = self.cluster.core()
        apps = self.cluster.apps()
        deployment = apps.read_namespaced_deployment(DEPLOYMENT, NAMESPACE)
        apps.patch_namespaced_deployment_scale(DEPLOYMENT, NAMESPACE, {"spec": {"replicas": 0}})
        pod_spec = deployment.spec.template.spec
        container = next(c for c in pod_spec.containers if c.name == CONTAINER)
        assert self.cluster.plane is not None
        identity = service_account_identity(
            core,
            namespace=NAMESPACE,
            service_account=pod_spec.service_account_name,
            server=self.cluster.plane.server,
            ca_file=self.cluster.plane.ca_file,
            path=self.workdir / "istiod.kubeconfig",
            expiration_seconds=TOKEN_SECONDS,
        )
        argv = [
            str(self.binary),
            *(container.args or []),
            f"--kubeconfig={identity.kubeconfig}",
            *self.ports.flags(secure_grpc_host=self.pod_address),
            f"--tlsCertFile={self.serving.cert}",
            f"--tlsKeyFile={self.serving.key}",
            f"--caCertFile={self.ca.cert}",
        ]
        env = host_env(
            container,
            service_account=pod_spec.service_account_name,
            kubeconfig=identity.kubeconfig,
        )
        env["HOME"] = str(self.run_dir)
        if self.for_pods:
            self.plug_in_ca()
        self.daemon = Daemon("istiod", argv, self.log_path, env=env, cwd=self.run_dir)
        self.daemon.start()
        self.wait_ready()
        if self.for_pods:  # the Deployment has no pods: the Service's endpoint is this process
            put_endpoint_slice(
                k8s.DiscoveryV1Api(self.cluster.core().api_client),
                NAMESPACE,
                "istiod-host",
                SERVICE,
                self.pod_address,
                [(SECURE_GRPC_PORT_NAME, self.ports.secure_grpc, "TCP")],
            )

    def plug_in_ca(self) -> None:
        """The test bed CA as istiod's signing CA: the files of Istio's `cacerts` Secret, where
        istiod looks for them (ROOT_CA_DIR, ./etc/cacerts from its working dir). A root that
        signs directly: it is its own chain."""
        assert self.ca is not None
        cacerts = self.run_dir / "etc" / "cacerts"
        cacerts.mkdir(parents=True, exist_ok=True)
        cert = self.ca.cert.read_bytes()
        for name in ("ca-cert.pem", "root-cert.pem", "cert-chain.pem"):
            (cacerts / name).write_bytes(cert)
        key = cacerts / "ca-key.pem"
        key.write_bytes(self.ca.key.read_bytes())
        key.chmod(0o600)

    def stop(self) -> None:
        """Undo start(): every step is tried; the failures are raised together."""
        errors: list[str] = []

        def attempt(what: str, step: Any) -> None:
            try:
                step()
            except Exception as e:  # the other steps still run
                errors.append(f"{what}: {e}")

        if self.daemon is not None:
            attempt("stop istiod", self.daemon.stop)
            self.daemon = None
        for release in (ISTIOD_RELEASE, BASE_RELEASE):
            if (release, NAMESPACE) in self.helm.releases:
                attempt(
                    f"helm uninstall {release}",
                    lambda r=release: self.helm.uninstall(r, namespace=NAMESPACE),
                )
        attempt("delete istiod's webhooks", self._delete_webhooks)
        attempt(f"delete the {ROOT_CERT_CONFIGMAP} ConfigMaps", self._delete_root_certs)
        if self._made_namespace:
            attempt(f"delete namespace {NAMESPACE}", self._delete_namespace)
        shutil.rmtree(self.pki_dir, ignore_errors=True)
        shutil.rmtree(self.run_dir / "etc" / "cacerts", ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (self.workdir / "istiod.kubeconfig").unlink()
        if errors:
            raise RuntimeError("istiod cleanup: " + "; ".join(errors))

    # -- readiness ---------------------------------------------------------------------------

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        assert self.daemon is not None
        daemon = self.daemon

        def check() -> bool:
            if not daemon.alive():
                raise daemon.failure("exited before it was ready")
            return self.http_status("/ready") == 200 and self.webhook_answers()

        wait_for(
            check,
            "istiod ready (GET /ready on its HTTP port; its webhook port answering over TLS)",
            timeout,
            interval=0.5,
            on_timeout=lambda: daemon.tail(60),
        )

    def http_status(self, path: str) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.ports.http, timeout=3)
        try:
            conn.request("GET", path)
            return conn.getresponse().status
        except OSError:
            return 0
        finally:
            conn.close()

    def webhook_answers(self) -> bool:
        """A TLS handshake verified against the CA the webhooks name, then any HTTP answer."""
        assert self.ca is not None
        ctx = ssl.create_default_context(cafile=str(self.ca.cert))
        conn = http.client.HTTPSConnection("127.0.0.1", self.ports.https, timeout=3, context=ctx)
        try:
            conn.request("GET", "/inject")
            conn.getresponse().read(1024)
            return True
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # -- cleanup -----------------------------------------------------------------------------

    def _delete_webhooks(self) -> None:
        """A webhook left behind with istiod gone would fail every matching pod creation."""
        admission = k8s.AdmissionregistrationV1Api(self.cluster.core().api_client)
        _delete(admission.delete_mutating_webhook_configuration, INJECTOR_WEBHOOK)
        for name in VALIDATING_WEBHOOKS:
            _delete(admission.delete_validating_webhook_configuration, name)

    def _delete_root_certs(self) -> None:
        core = self.cluster.core()
        found = core.list_config_map_for_all_namespaces(
            field_selector=f"metadata.name={ROOT_CERT_CONFIGMAP}"
        )
        for cm in found.items:
            _delete(core.delete_namespaced_config_map, cm.metadata.name, cm.metadata.namespace)

    def _delete_namespace(self) -> None:
        core = self.cluster.core()
        _delete(core.delete_namespace, NAMESPACE)
        wait_for(lambda: not _namespace_exists(core, NAMESPACE), f"namespace {NAMESPACE} gone", 90)


def _namespace_exists(core: Any, name: str) -> bool:
    try:
        core.read_namespace(name)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


def _delete(delete: Any, *args: str) -> None:
    """Delete an object; gone already is fine."""
    try:
        delete(*args)
    except ApiException as e:
        if e.status != 404:
            raise
