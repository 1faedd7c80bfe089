# helm test: the check container of the capture test pod. Its connection to a documentation
# address must arrive at the pod's own proxy stand-in on 15001 (the agent's capture); sent with
# TTL 1, so that uncaptured it dies at the node instead of leaving it.
import os
import socket
import sys
import time

env = os.environ
NODE, POD, IP = env["NODE_NAME"], env["POD_NAMESPACE"] + "/" + env["POD_NAME"], env.get("POD_IP", "")
TIMEOUT = float(env.get("CONNECT_TIMEOUT", "3"))
V6 = ":" in IP
DEST = ("2001:db8::1", 80) if V6 else ("192.0.2.1", 80)
SHOWN = "[%s]:%d" % DEST if V6 else "%s:%d" % DEST
FAMILY = socket.AF_INET6 if V6 else socket.AF_INET


def done(code, message):
    print(message, flush=True)
    try:
        open("/run/test/done", "w").close()
    except OSError:
        pass
    sys.exit(code)


def banner(address, ttl_one):
    with socket.socket(FAMILY if address == DEST else socket.AF_INET, socket.SOCK_STREAM) as s:
        if ttl_one and V6:
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
            return banner(("127.0.0.1", 15001), False)
        except OSError as e:
            if time.monotonic() > deadline:
                done(1, "FAILED on node %s: the test's own proxy stand-in did not listen on 15001: %s" % (NODE, e))
            time.sleep(0.3)


def why_not():
    excluded = [n for n in env.get("EXCLUDED_NAMESPACES", "").split(",") if n]
    if env["POD_NAMESPACE"] in excluded:
        return (
            "namespace %s is in the agent's excludeNamespaces (%s): the plugin passes its pods "
            "without capture" % (env["POD_NAMESPACE"], ", ".join(excluded))
        )
    return (
        "ask the agent of node %s: kubectl -n %s exec <its istio-cni pod> -- istio-cni-agent "
        "status %s" % (NODE, env.get("AGENT_NAMESPACE", "kube-system"), POD)
    )


wait_for_proxy()
error = answer = ""
for attempt in range(3):
    try:
        answer = banner(DEST, True)
        break
    except ConnectionRefusedError as e:  # captured, while the stand-in was not yet listening
        error = str(e)
        time.sleep(0.5)
    except OSError as e:
        error = "%s: not redirected; the connection left the pod" % (e.strerror or e)
        break
if answer.startswith("istio-cni-test-proxy ") and answer.endswith("original_dst=" + SHOWN):
    done(0, "passed on node %s: pod %s's connection to %s arrived at its own proxy on 15001 (%s)" % (NODE, POD, SHOWN, answer))
seen = ("answered %r, not by its proxy" % answer[:80]) if answer else error
done(1, "FAILED on node %s: pod %s is not captured: its connection to %s did not arrive at its proxy on 15001 (%s). The agent's reason: %s" % (NODE, POD, SHOWN, seen, why_not()))
