"""`istio-cni-agent install` and `istio-cni-agent uninstall`: one shot, exit code says it all."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType

from agent.config import DEFAULT_CONFIG_PATH, Settings, load_settings
from agent.downward import AgentPod
from agent.errors import AgentError, TransientInstallError
from agent.install.installer import Installer
from agent.install.waiting import wait_installed
from agent.logs import setup_logging

log = logging.getLogger(__name__)


def _parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"istio-cni-agent {command}")
    p.add_argument("--config", default=DEFAULT_CONFIG_PATH, help="agent config.yaml")
    if command == "install":
        p.add_argument(
            "--timeout",
            type=float,
            default=None,
            metavar="SECONDS",
            help="give up when no primary CNI config appears in this time "
            "(default: wait until one does)",
        )
    return p


def make_installer(settings: Settings, pod: AgentPod) -> Installer:
    """The installer for this agent pod (its name and namespace mark our config entry)."""
    return Installer(settings, pod_name=pod.pod_name, pod_namespace=pod.pod_namespace)


def main(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    try:
        settings = load_settings(args.config)
    except AgentError as e:
        sys.stderr.write(f"istio-cni-agent {command}: {e}\n")
        return 1
    setup_logging(settings.log_levels, as_json=settings.logAsJson)
    installer = make_installer(settings, AgentPod.from_env())
    try:
        if command == "install":
            return _install(installer, args.timeout)
        removed = installer.uninstall()
    except AgentError as e:
        log.error("%s failed", command, extra={"fields": {"error": str(e)}})
        sys.stderr.write(f"istio-cni-agent {command}: {e}\n")
        return 1
    log.info("uninstalled", extra={"fields": {"removed": ",".join(removed) or "nothing"}})
    return 0


def _install(installer: Installer, timeout: float | None) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        wait_installed(installer, timeout=timeout, stop=stop)
    except TransientInstallError as e:
        sys.stderr.write(f"istio-cni-agent install: not installed: {e}\n")
        return 1
    problems = installer.problems()
    if problems:
        sys.stderr.write(
            "istio-cni-agent install: not in place after install: " + "; ".join(problems) + "\n"
        )
        return 1
    log.info(
        "installed",
        extra={"fields": {"bin_dir": installer.bin_dir, "conf_dir": installer.conf_dir}},
    )
    return 0
