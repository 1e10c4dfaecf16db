"""Small readers of what the processes of a run leave behind: log lines, the events file, the
alert rules, and the ports the hosts keep across restarts.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import signal
import socket
from pathlib import Path

from kura_harness.launch.process import http_get
from kura_harness.rolling.config import ALERT_LINE, LOG_LINE, DemoError


def _ephemeral_low() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def pick_ports(count: int, rng: random.Random) -> list[int]:
    """``count`` distinct free ports below the ephemeral range, so that no outgoing connection
    takes one while its node is down (they are reused when a host restarts)."""
    high = min(_ephemeral_low(), 32768) - 1
    low = 20000
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        attempts = 0
        while len(ports) < count:
            attempts += 1
            if attempts > 5000:
                raise DemoError("no free ports found on 127.0.0.1")
            port = rng.randint(low, high) if high - low > 1000 else 0
            if port in ports:
                continue
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            held.append(sock)
            ports.append(int(sock.getsockname()[1]))
        return ports
    finally:
        for sock in held:
            sock.close()


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def log_times(log: str, message_prefix: str) -> list[float]:
    """Unix times of every log line (kit.log format, local time) whose message starts with
    ``message_prefix``."""
    times = []
    for line in log.splitlines():
        m = LOG_LINE.match(line)
        if m and m.group(2).startswith(message_prefix):
            stamp = dt.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f")
            times.append(stamp.timestamp())
    return times


def read_events(path: Path) -> list[tuple[float, str, str]]:
    """``events.log`` as sorted (unix time, host, what)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append((float(parts[0]), parts[1], parts[2]))
    return sorted(out)


def find_repo(start: Path | None = None) -> Path | None:
    """The kura checkout (it has deploy/alerts and tests/clients): ``start``, the current
    directory or the one this package was installed from (editable installs)."""
    candidates = [start] if start is not None else []
    candidates += [Path.cwd(), Path(__file__).resolve().parents[4]]
    for base in candidates:
        if base is None:
            continue
        for d in (base, *base.parents):
            if (d / "deploy" / "alerts" / "kura.rules.yml").is_file():
                return d
    return None


def kura_alert_names(rules_file: Path) -> list[str]:
    return ALERT_LINE.findall(rules_file.read_text())


def signal_name(sig: int) -> str:
    return signal.Signals(sig).name


def ready(url: str) -> bool:
    """``url``/ready answers 200 (False when nothing answers)."""
    try:
        return http_get(url + "/ready", 2)[0] == 200
    except OSError:
        return False
