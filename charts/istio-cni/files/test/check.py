# helm test: the check container of the capture test pod. Its connection to a documentation
# address must arrive at the pod's own proxy stand-in on 15001 (the agent's capture); sent with
# TTL 1, so that uncaptured it dies at the node instead of leaving it.
import contextlib
import os
import socket
import sys
import time

env = os.environ
NODE, IP = env["NODE_NAME"], env.get("POD_IP", "")
POD = env["POD_NAMESPACE"] + "/" + env["POD_NAME"]
TIMEOUT = float(env.get("CONNECT_TIMEOUT", "3"))
V6 = ":" in IP
DEST = ("2001:db8::1", 80) if V6 else ("192.0.2.1", 80)
SHOWN = f"[{DEST[0]}]:80" if V6 else f"{DEST[0]}:80"


def done(code, message):
    print(("passed" if code == 0 else "FAILED") + f" on node {NODE}: {message}", flush=True)
    with contextlib.suppress(OSError):
        open("/run/test/done", "w").close()
    sys.exit(code)


def banner(address, family, ttl_one):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        if ttl_one and family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, 1)
        elif ttl_one:
            s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 1)
        s.settimeout(TIMEOUT)
        s.connect(address)
        return s.makefile().readline(256).strip()


def wait_for_proxy():
    deadline = time.monotonic() + 30
    while True:
        try:
            return banner(("127.0.0.1", 15001), socket.AF_INET, False)
        except OSError as e:
            if time.monotonic() > deadline:
                done(1, f"the test's own proxy stand-in did not listen on 15001: {e}")
            time.sleep(0.3)


def why_not():
    excluded = [n for n in env.get("EXCLUDED_NAMESPACES", "").split(",") if n]
    if env["POD_NAMESPACE"] in excluded:
        return (
            f"namespace {env['POD_NAMESPACE']} is in the agent's excludeNamespaces "
            f"({', '.join(excluded)}): the plugin passes its pods without capture"
        )
    agents = env.get("AGENT_NAMESPACE", "kube-system")
    return (
        f"ask the agent of node {NODE}: kubectl -n {agents} exec <its istio-cni pod> -- "
        f"istio-cni-agent status {POD}"
    )


def connect():
    """(the stand-in's answer, or "" and what happened instead)."""
    family = socket.AF_INET6 if V6 else socket.AF_INET
    error = ""
    for _ in range(3):
        try:
            return banner(DEST, family, True), ""
        except ConnectionRefusedError as e:  # captured, while the stand-in was not listening
            error = str(e)
            time.sleep(0.5)
        except OSError as e:
            return "", f"{e.strerror or e}: not redirected, the connection left the pod"
    return "", error


wait_for_proxy()
answer, error = connect()
if answer.startswith("istio-cni-test-proxy ") and answer.endswith("original_dst=" + SHOWN):
    done(0, f"pod {POD}'s connection to {SHOWN} arrived at its own proxy on 15001 ({answer})")
seen = f"answered {answer[:80]!r}, not by its proxy" if answer else error
done(
    1,
    f"pod {POD} is not captured: its connection to {SHOWN} did not arrive at its proxy on "
    f"15001 ({seen}). The agent's reason: {why_not()}",
)
