"""Fuzz the request parser: 10,000 mutated configs and environments (fixed seed).

Every run must end in exactly one of: exit 0 with a valid result (or nothing, as the command
says), or exit 1 with one CNI error object of a known code. A code 999 means an exception
escaped the checks: that is a crash.
"""

from __future__ import annotations

import json
import random
from typing import Any

from tests.plugin.helpers import (
    VERSIONS,
    AgentTestDouble,
    cni_env,
    net_conf,
    result_for,
    run_plugin,
)

RUNS = 10_000
COMMANDS = ["ADD", "CHECK", "DEL", "GC", "STATUS", "VERSION", "", "add", "FINALIZE"]
KNOWN_CODES = {1, 3, 4, 6, 7, 50}
KEEP = ("cni_agent_run_dir",)  # always the double's: no fuzzed run may reach a real agent


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 2 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.randint(-(2**40), 2**40)
    if kind == 3:
        return rng.uniform(-1e9, 1e9)
    if kind == 4:
        return rng.choice(["", "1.0.0", "0.3.1", "9.9", "eth0", "ñ", "/", "a" * 300, "10.0.0.1/24"])
    if kind == 5:
        return "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(8)))
    if kind == 6:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 7:
        keys = ["address", "version", "ips", "x", "cniVersion"]
        return {rng.choice(keys): random_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return {
        "address": rng.choice(["10.1.0.9/24", "fd00::1/64", "x", "1.2.3.4"]),
        "version": rng.choice(["4", "6", 4]),
    }


def mutate_tree(rng: random.Random, obj: Any) -> None:
    """Delete, replace or add one entry somewhere inside obj (dicts and lists)."""
    for _ in range(rng.randrange(1, 4)):
        node = obj
        while True:
            children = (
                [k for k in node if k not in KEEP]
                if isinstance(node, dict)
                else list(range(len(node)))
            )
            if not children:
                break
            child = rng.choice(children)
            if isinstance(node[child], (dict, list)) and rng.random() < 0.5:
                node = node[child]
                continue
            action = rng.randrange(3)
            if action == 0:
                del node[child]
            elif action == 1:
                node[child] = random_value(rng)
            elif isinstance(node, dict):
                node[
                    rng.choice(
                        [
                            "prevResult",
                            "name",
                            "type",
                            "cniVersion",
                            "ips",
                            "z",
                            "cni.dev/valid-attachments",
                            "exclude_namespaces",
                        ]
                    )
                ] = random_value(rng)
            break


def mutate_bytes(rng: random.Random, data: bytes, keep: bytes) -> bytes:
    """Cut, flip or insert one byte, never inside `keep` (the run dir entry)."""
    start = data.find(keep)
    while True:
        pos = rng.randrange(len(data) + 1)
        if start < 0 or not start <= pos <= start + len(keep):
            break
    action = rng.randrange(3)
    if action == 0:
        return data[:pos]
    if action == 1:
        return data[:pos] + bytes([rng.randrange(256)]) + data[pos + 1 :]
    return data[:pos] + rng.choice([b"{", b"}", b'"', b",", b"\x00", b"\xc3"]) + data[pos:]


def mutate_env(rng: random.Random, env: dict[str, str]) -> None:
    env["CNI_COMMAND"] = rng.choice(COMMANDS[:6] if rng.random() < 0.9 else COMMANDS)
    for _ in range(rng.choice([0, 0, 0, 1, 2])):
        var = rng.choice([*env, "CNI_ARGS"])
        if rng.random() < 0.4:
            env.pop(var, None)
        else:
            env[var] = rng.choice(
                [
                    "",
                    "x",
                    "-x",
                    "a" * 20,
                    "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=p",
                    "K8S_POD_NAME",
                    ";;",
                    "K8S_POD_NAMESPACE=default;K8S_POD_NAME=",
                    "eth0 ",
                    "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p;K8S_POD_UID=u",
                ]
            )


def check(run: Any, env: dict[str, str], stdin: bytes) -> None:
    where = f"env={env} stdin={stdin[:300]!r} stdout={run.raw!r} stderr={run.err[-500:]!r}"
    if run.code == 1:
        assert isinstance(run.out, dict), where
        assert set(run.out) == {"cniVersion", "code", "msg", "details"}, where
        # "Try again later" would mean the double was not reached: its entry is never mutated.
        assert run.out["code"] != 11, where
        assert run.out["code"] in KNOWN_CODES, where
        assert isinstance(run.out["msg"], str) and run.out["msg"], where
        assert run.out["cniVersion"] in VERSIONS, where
        return
    assert run.code == 0, where
    command = env.get("CNI_COMMAND")
    if command == "VERSION":
        assert run.out["supportedVersions"] == list(VERSIONS), where
    elif command == "ADD":
        assert isinstance(run.out, dict) and run.out["cniVersion"] in VERSIONS, where
        legacy = run.out["cniVersion"].startswith("0.")
        for ip in run.out.get("ips", []):
            assert ("version" in ip) == legacy, where
    else:
        assert run.out is None, where


def test_fuzz_request_parser(agent: AgentTestDouble) -> None:
    rng = random.Random(20261130)
    outcomes: dict[str, int] = {}
    for _ in range(RUNS):
        version = rng.choice(VERSIONS)
        conf = net_conf(
            version,
            str(agent.run_dir),
            prevResult=result_for(rng.choice(VERSIONS)),
            **{"cni.dev/valid-attachments": [{"containerID": "a", "ifname": "e"}]},
        )
        env = cni_env("ADD")
        mutate_env(rng, env)
        if rng.random() < 0.8:
            mutate_tree(rng, conf)
        stdin = json.dumps(conf).encode()
        if rng.random() < 0.2:
            keep = json.dumps({"cni_agent_run_dir": str(agent.run_dir)})[1:-1].encode()
            stdin = mutate_bytes(rng, stdin, keep)
        run = run_plugin(env, stdin)
        check(run, env, stdin)
        key = "ok" if run.code == 0 else f"code {run.out['code']}"
        outcomes[key] = outcomes.get(key, 0) + 1
    # The generator must reach both outcomes often, or it is not testing the parser.
    assert outcomes.get("ok", 0) > RUNS // 20, outcomes
    assert sum(v for k, v in outcomes.items() if k != "ok") > RUNS // 4, outcomes
