"""The real-limiter suite's servers: nginx, HAProxy, the Python and Node sites, as child processes.

One nginx (one ``server`` block and zone per instance), one HAProxy (one
``frontend`` and stick table per instance), one Python process
(:mod:`benchmarks.real_limiters_sites`: the ``limits`` library's limiters
and the slow origin) and one Node process (``real_limiters_express.js``:
express-rate-limit, installed with npm under :data:`NODE_HOME`), each with
its configuration in the run's directory, listening on 127.0.0.1 only and
stopped by its own PID. Their access logs, with millisecond timestamps and
statuses, are read back as :data:`~benchmarks.quality_sites.Record` tuples.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .quality_sites import Record

__all__ = ["Instance", "RealLimiter", "Servers", "ensure_servers", "free_port"]

REPO = Path(__file__).resolve().parent.parent
#: The Retry-After HAProxy's deny sends (HAProxy does not log response headers it generates).
HAPROXY_RETRY_AFTER = 1
#: Latency of the origin behind nginx's limit_conn.
ORIGIN_DELAY = 0.1
#: How each kind is served: the server, and the nginx location / Python site kind.
KINDS = {
    "limit_req": "nginx",
    "burst": "nginx",
    "limit_conn": "nginx",
    "haproxy": "haproxy",
    "moving": "python",
    "moving-int": "python",
    "fixed": "python",
    "express": "node",
}
#: The Node packages of the express-rate-limit site (majors as of this suite), and
#: where npm installs them once per machine (outside the checkout).
NODE_PACKAGES = ("express@5", "express-rate-limit@8")
NODE_HOME = Path(tempfile.gettempdir()) / "throttlekit-benchmarks-node"
#: The express-rate-limit site's rateLimit({windowMs, limit}): 25 per 5 s.
EXPRESS_WINDOW_MS = 5_000
EXPRESS_LIMIT = 25
#: The system packages that provide each server's executable.
APT_PACKAGES = {"nginx": ("nginx",), "haproxy": ("haproxy",), "node": ("nodejs", "npm")}


@dataclass(frozen=True)
class RealLimiter:
    """One deployed limiter as configured, and what it allows.

    ``kind`` is one of :data:`KINDS`; ``rate`` the allowed rate (requests per
    second; for ``limit_conn`` the limit over the origin's latency);
    ``oracle`` the paced client's plan (``{"rate": r}`` or ``{"workers": n}``);
    ``reach_window`` the trailing window over which "90 % reached" is judged,
    within ``reach_by`` seconds.
    """

    name: str
    kind: str
    summary: str
    rate: float
    oracle: dict[str, Any]
    seconds: float
    reach_window: float = 5.0
    reach_by: float = 15.0

    @property
    def server(self) -> str:
        return KINDS[self.kind]

    @property
    def slug(self) -> str:
        return self.name.lower().replace(" ", "-").replace("_", "-")


@dataclass
class Instance:
    """One limiter served to one client: its port, its access log and, at the end, its records."""

    limiter: RealLimiter
    client: str
    port: int
    log: Path
    records: list[Record] = field(default_factory=list)
    #: The client's own view of this instance: its final throttling state and samples.
    view: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


#: Where Linux takes the source ports of outgoing connections from. A port
#: that a bind to port 0 found free comes from the same range, and another
#: socket (a client's connection) may take it before the server binds it
#: ("address already in use"), so servers get ports below that range.
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: The lowest port handed out, and the fewest ports that must lie between it
#: and the ephemeral range for a random pick there.
LOWEST_PORT = 10_000
FEWEST_PORTS = 1_000
#: Random picks tried before falling back to the kernel's (port 0).
PORT_TRIES = 100

_handed: set[int] = set()  # ports this process handed out (not yet bound, maybe)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on, below the ephemeral range if it can."""
    top = _ephemeral_low()
    for _ in range(PORT_TRIES if top - LOWEST_PORT >= FEWEST_PORTS else 0):
        port = random.randrange(LOWEST_PORT, top)
        if port not in _handed and _bindable(port):
            _handed.add(port)
            return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        found: int = probe.getsockname()[1]
        return found


def _ephemeral_low() -> int:
    """The lowest ephemeral port (Linux's default, 32768, where it cannot be read)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _executable(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidate = Path("/usr/sbin") / name
    return str(candidate) if candidate.exists() else None


def ensure_servers(
    servers: Collection[str] = ("nginx", "haproxy", "node"),
) -> dict[str, str | None]:
    """For each of ``servers``: ``None`` when it can run, else why it is skipped.

    A missing executable is installed with apt-get when this runs as root on
    a system that has it (the package's own service is not used); the Node
    site's packages with npm (:func:`_node_packages`).
    """
    wanted = [name for name in servers if name in APT_PACKAGES]
    missing = [name for name in wanted if _executable(name) is None]
    if missing and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        packages = [package for name in missing for package in APT_PACKAGES[name]]
        for command in (
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
        ):
            subprocess.run(command, env=env, check=False, capture_output=True, timeout=600)
    reasons: dict[str, str | None] = {
        name: None
        if _executable(name)
        else f"{name} is not installed and apt-get could not install it "
        f"(run as root on a Debian-like system, or install {' and '.join(APT_PACKAGES[name])})"
        for name in wanted
    }
    if "node" in reasons and reasons["node"] is None:  # (node runs: its site's packages too)
        reasons["node"] = _node_packages()
    return reasons


def _node_packages() -> str | None:
    """Install :data:`NODE_PACKAGES` under :data:`NODE_HOME` unless there; why not, if it cannot."""
    modules = NODE_HOME / "node_modules"
    if all((modules / name.rsplit("@", 1)[0]).is_dir() for name in NODE_PACKAGES):
        return None
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not installed (it installs express and express-rate-limit)"
    NODE_HOME.mkdir(parents=True, exist_ok=True)
    command = [npm, "install", "--prefix", str(NODE_HOME), "--no-audit", "--no-fund"]
    try:
        done = subprocess.run(
            [*command, *NODE_PACKAGES], capture_output=True, text=True, timeout=600, check=False
        )
    except subprocess.TimeoutExpired:
        return f"npm did not install {' '.join(NODE_PACKAGES)} within 600 s"
    if done.returncode:
        return f"npm could not install {' '.join(NODE_PACKAGES)}: {done.stderr.strip()[-300:]}"
    return None


# -- nginx -------------------------------------------------------------------------------

_NGINX_LOCATIONS = {
    "limit_req": (
        "limit_req zone=z{index};\n      limit_req_status 429;\n"
        "      root {html};\n      try_files /ok.txt =404;"
    ),
    "burst": (
        "limit_req zone=z{index} burst=10 nodelay;\n"
        "      root {html};\n      try_files /ok.txt =404;"
    ),
    "limit_conn": (
        "limit_conn z{index} 4;\n      proxy_pass http://origin;\n"
        '      proxy_http_version 1.1;\n      proxy_set_header Connection "";'
    ),
}
_NGINX_ZONES = {
    "limit_req": "limit_req_zone $binary_remote_addr zone=z{index}:1m rate=10r/s;",
    "burst": "limit_req_zone $binary_remote_addr zone=z{index}:1m rate=20r/s;",
    "limit_conn": "limit_conn_zone $binary_remote_addr zone=z{index}:1m;",
}


def nginx_config(instances: Sequence[Instance], prefix: Path, origin_port: int) -> Path:
    """Write nginx's configuration for ``instances`` under ``prefix``; its path."""
    (prefix / "html").mkdir(parents=True, exist_ok=True)
    (prefix / "html" / "ok.txt").write_text("ok\n", encoding="utf-8")
    temp = prefix / "tmp"
    temp.mkdir(parents=True, exist_ok=True)
    lines = [
        "worker_processes 1;",
        f"pid {prefix / 'nginx.pid'};",
        f"error_log {prefix / 'error.log'} warn;",
        *(["user root;"] if os.geteuid() == 0 else []),  # the workers read the temp directory
        "events { worker_connections 4096; }",
        "http {",
        "  access_log off;",
        *(f"  {kind}_temp_path {temp / kind};" for kind in ("client_body", "proxy", "fastcgi")),
        *(f"  {kind}_temp_path {temp / kind};" for kind in ("uwsgi", "scgi")),
        "  log_format timed '$msec $request_time $status';",
        "  keepalive_requests 1000000;",
        "  limit_req_log_level info;",
        "  limit_conn_log_level info;",
        f"  upstream origin {{ server 127.0.0.1:{origin_port}; keepalive 64; }}",
    ]
    for index, instance in enumerate(instances):
        kind = instance.limiter.kind
        lines += [
            "  " + _NGINX_ZONES[kind].format(index=index),
            "  server {",
            f"    listen 127.0.0.1:{instance.port};",
            f"    access_log {instance.log} timed;",
            "    location / {",
            "      " + _NGINX_LOCATIONS[kind].format(index=index, html=prefix / "html"),
            "    }",
            "  }",
        ]
    lines.append("}")
    path = prefix / "nginx.conf"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# -- HAProxy -----------------------------------------------------------------------------


def haproxy_config(instances: Sequence[Instance], path: Path) -> Path:
    """Write HAProxy's configuration for ``instances`` (logs on stdout); its path."""
    lines = [
        "global",
        "  log stdout format raw local0",
        "  maxconn 4096",
        "defaults",
        "  mode http",
        "  log global",
        "  option dontlognull",  # the readiness probes' empty connections
        "  timeout connect 5s",
        "  timeout client 60s",
        "  timeout server 60s",
        '  log-format "%f %[date(0,ms)] %Ta %ST"',
    ]
    for index, instance in enumerate(instances):
        lines += [
            f"frontend f{index}",
            f"  bind 127.0.0.1:{instance.port}",
            "  stick-table type ip size 100k expire 30s store http_req_rate(1s)",
            "  http-request track-sc0 src",
            f"  http-request deny deny_status 429 hdr Retry-After {HAPROXY_RETRY_AFTER} "
            "if { sc_http_req_rate(0) gt 10 }",
            '  http-request return status 200 content-type text/plain string "ok"',
        ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# -- logs --------------------------------------------------------------------------------


def _nginx_records(text: str) -> list[Record]:
    """``$msec $request_time $status``: logged when the request ends."""
    records = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            finished, took, status = float(parts[0]), float(parts[1]), int(parts[2])
            records.append((finished - took, finished, status, 0.0))
    return records


def _haproxy_records(text: str, frontend: str) -> list[Record]:
    """``%f %[date(0,ms)] %Ta %ST``: the frontend, the log time (ms), the active time (ms)."""
    records = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == frontend:
            finished, took, status = (
                int(parts[1]) / 1000,
                max(0, int(parts[2])) / 1000,
                int(parts[3]),
            )
            wait = float(HAPROXY_RETRY_AFTER) if status == 429 else 0.0
            records.append((finished - took, finished, status, wait))
    return records


def _site_records(text: str) -> list[Record]:
    """The Python and Node sites' ``arrival answer status retry_after``; a refusal's
    Retry-After is its announced wait."""
    records = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4:
            status = int(parts[2])
            wait = float(parts[3]) if status >= 400 else 0.0
            records.append((float(parts[0]), float(parts[1]), status, wait))
    return records


class Servers:
    """The servers of a set of instances, started on ``__enter__`` and stopped on ``__exit__``.

    On exit every instance's ``records`` are read from its server's log.
    """

    def __init__(self, instances: Sequence[Instance], workdir: Path) -> None:
        self.instances = list(instances)
        self.workdir = workdir
        self.processes: list[subprocess.Popen[bytes]] = []
        self.origin_port = free_port()
        self.haproxy_log = workdir / "haproxy.log"

    def _of(self, server: str) -> list[Instance]:
        return [instance for instance in self.instances if instance.limiter.server == server]

    def _start(self, command: list[str], output: Path, **env: str) -> None:
        path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
        with output.open("wb") as out:
            self.processes.append(
                subprocess.Popen(
                    command,
                    cwd=self.workdir,
                    env={**os.environ, "PYTHONPATH": path, **env},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )

    def __enter__(self) -> Servers:
        self.workdir.mkdir(parents=True, exist_ok=True)
        ports = [instance.port for instance in self.instances]
        sites: list[dict[str, Any]] = [
            {"port": i.port, "kind": i.limiter.kind, "log": str(i.log)} for i in self._of("python")
        ]
        for site in sites:
            site["limit"] = "60/minute" if site["kind"] == "fixed" else "10/second"
        if any(i.limiter.kind == "limit_conn" for i in self.instances):
            sites.append({"port": self.origin_port, "kind": "origin", "delay": ORIGIN_DELAY})
            ports.append(self.origin_port)
        try:
            if sites:
                plan = self.workdir / "sites.json"
                plan.write_text(json.dumps({"sites": sites}), encoding="utf-8")
                command = [sys.executable, "-m", "benchmarks.real_limiters_sites", str(plan)]
                self._start(command, self.workdir / "sites.out")
            if self._of("node"):
                self._start_node()
            if self._of("nginx"):
                self._start_nginx()
            if self._of("haproxy"):
                config = haproxy_config(self._of("haproxy"), self.workdir / "haproxy.cfg")
                self._start(
                    [str(_executable("haproxy")), "-db", "-f", str(config)], self.haproxy_log
                )
            self._wait_listening(ports)
        except BaseException:
            self._stop()
            raise
        return self

    def _start_node(self) -> None:
        limit = {"window_ms": EXPRESS_WINDOW_MS, "limit": EXPRESS_LIMIT}
        sites = [{"port": i.port, "log": str(i.log), **limit} for i in self._of("node")]
        plan = self.workdir / "express.json"
        plan.write_text(json.dumps({"sites": sites}), encoding="utf-8")
        script = REPO / "benchmarks" / "real_limiters_express.js"
        command = [str(_executable("node")), str(script), str(plan)]
        modules = str(NODE_HOME / "node_modules")
        self._start(command, self.workdir / "express.out", NODE_PATH=modules)

    def _start_nginx(self) -> None:
        prefix = self.workdir / "nginx"
        config = nginx_config(self._of("nginx"), prefix, self.origin_port)
        error_log = str(prefix / "error.log")
        command = [str(_executable("nginx")), "-p", str(prefix), "-c", str(config), "-e", error_log]
        self._start([*command, "-g", "daemon off;"], self.workdir / "nginx.out")

    def _wait_listening(self, ports: list[int], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        waiting = set(ports)
        while True:
            for port in sorted(waiting):
                with socket.socket() as probe:
                    if probe.connect_ex(("127.0.0.1", port)) == 0:
                        waiting.discard(port)
            if not waiting:
                return
            exited = [p.returncode for p in self.processes if p.poll() is not None]
            if exited or time.monotonic() > deadline:
                logs = " | ".join(
                    f"{path.name}: {path.read_text(errors='replace')[-1500:]}"
                    for path in sorted(self.workdir.glob("*.out"))
                )
                raise RuntimeError(f"servers not up (exited: {exited}, waiting: {waiting}); {logs}")
            time.sleep(0.05)

    def _stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __exit__(self, *exc: object) -> None:
        self._stop()
        haproxy = self.haproxy_log.read_text(errors="replace") if self.haproxy_log.exists() else ""
        frontends = {id(instance): f"f{n}" for n, instance in enumerate(self._of("haproxy"))}
        for instance in self.instances:
            if instance.limiter.server == "haproxy":
                instance.records = _haproxy_records(haproxy, frontends[id(instance)])
            elif instance.log.exists():
                text = instance.log.read_text(errors="replace")
                parse = _nginx_records if instance.limiter.server == "nginx" else _site_records
                instance.records = parse(text)
