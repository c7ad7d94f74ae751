"""Helpers shared by bench/serve_embed.py and bench/serve_llm.py.

Starting a server process on a free loopback port, waiting for its health
endpoint, stopping it (SIGTERM, then SIGKILL), the machine description
(CPU model, cores, load average) and percentiles. Nothing here measures.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict:
    info: dict = {"nproc": os.cpu_count(), "platform": platform.platform(),
                  "python": platform.python_version()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            if k.strip() == "Model name":
                info["cpu"] = v.strip()
    except Exception as e:  # noqa: BLE001 - best effort
        info["cpu_error"] = str(e)
    return info


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return None


def pct(xs: list[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation; None when empty."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return pct(xs, 50) if xs else None


def http_json(url: str, body: dict | None = None, timeout: float = 30) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class Server:
    """A server subprocess; its stdout/stderr go to `log`."""

    def __init__(self, name: str, cmd: list[str], port: int, health: str, log: Path,
                 env: dict | None = None, cwd: Path | None = None):
        self.name, self.cmd, self.port, self.health = name, cmd, port, health
        self.log_path = log
        self.base = f"http://127.0.0.1:{port}"
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 600) -> float:
        """Start and wait until `health` answers 200; returns the seconds taken."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "ab")
        self.log.write(f"\n=== {time.strftime('%F %T')} {' '.join(self.cmd)}\n".encode())
        self.log.flush()
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=self.env, cwd=self.cwd, start_new_session=True)
        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before "
                                   f"it was healthy; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.base + self.health, timeout=5) as r:
                    if r.status == 200:
                        return time.perf_counter() - t0
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{self.name} not healthy after {timeout}s; see {self.log_path}")

    def cpu_seconds(self) -> float | None:
        """CPU time (user + system) used so far by the server process and
        its descendants (from /proc; None off Linux or once stopped)."""
        if self.proc is None or not os.path.isdir("/proc"):
            return None
        tick = os.sysconf("SC_CLK_TCK")
        stats: dict[int, tuple[int, float]] = {}  # pid -> (ppid, cpu seconds)
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(d)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) / tick)
        tree, total = {self.proc.pid}, 0.0
        grew = True
        while grew:
            grew = False
            for pid, (ppid, _) in stats.items():
                if ppid in tree and pid not in tree:
                    tree.add(pid)
                    grew = True
        for pid in tree:
            total += stats.get(pid, (0, 0.0))[1]
        return total

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self.log.close()


def versions(packages: list[str]) -> dict:
    """Installed versions of `packages` (None where one is absent)."""
    import importlib.metadata as m
    out = {}
    for p in packages:
        try:
            out[p] = m.version(p)
        except m.PackageNotFoundError:
            out[p] = None
    return out
