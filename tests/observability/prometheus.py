"""Debian's Prometheus server, run for one test: loopback only, a temp dir for its config and
TSDB, a free port, killed when the test ends. Queried through its HTTP API."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from testbed.ports import free_port
from testbed.wait import wait_for
from tests.observability.promtool import binary


class QueryError(Exception):
    """Prometheus refused a query (bad_data: it does not parse)."""


class PrometheusServer:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
        self.proc = proc
        self.port = port
        self.log_path = log_path

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                body = json.loads(reply.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read() or b"{}")
            raise QueryError(f"{path} {params}: {e.code} {body.get('error', '')}") from e
        if body.get("status") != "success":
            raise QueryError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of `expr` now (raises QueryError when it does not parse)."""
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"] if data["resultType"] == "vector" else []
        return result

    def value(self, expr: str) -> float | None:
        """The single value of `expr` now, None when it has no series."""
        result = self.query(expr)
        assert len(result) <= 1, f"{expr}: {len(result)} series: {result}"
        return float(result[0]["value"][1]) if result else None

    def wait_value(
        self, expr: str, accept: Callable[[float | None], bool], what: str, timeout: float = 45.0
    ) -> float | None:
        seen: list[float | None] = [None]

        def accepted() -> tuple[float | None] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited {self.proc.returncode}:\n{self.logs()}")
            seen[0] = self.value(expr)
            return (seen[0],) if accept(seen[0]) else None  # a tuple: None may be accepted

        return wait_for(
            accepted, what, timeout, interval=0.25, on_timeout=lambda: f"{expr} = {seen[0]}"
        )[0]

    def ready(self) -> bool:
        """GET /-/ready answers 200; raises when the process has exited."""
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited {self.proc.returncode}:\n{self.logs()}")
        try:
            url = f"http://127.0.0.1:{self.port}/-/ready"
            with urllib.request.urlopen(url, timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]


def scrape_config(
    *, job: str, address: str, metrics_path: str, labels: Mapping[str, str], targets_file: Path
) -> dict[str, Any]:
    """A scrape job over a file_sd target list (what service discovery would have found)."""
    targets_file.write_text(json.dumps([{"targets": [address], "labels": dict(labels)}]))
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": job,
                "metrics_path": metrics_path,
                "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "5s"}],
            }
        ],
    }


@contextmanager
def running_prometheus(workdir: Path, config: Mapping[str, Any]) -> Iterator[PrometheusServer]:
    """Start the server with `config`, wait until it answers, kill it on the way out."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(dict(config)))
    check = subprocess.run(
        [binary("promtool"), "check", "config", str(config_path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    log_path = workdir / "prometheus.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                binary("prometheus"),
                f"--config.file={config_path}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
        )
    server = PrometheusServer(proc, port, log_path)
    try:
        wait_for(server.ready, "prometheus to be ready", 30, on_timeout=server.logs)
        yield server
    finally:
        proc.kill()
        proc.wait(timeout=30)
