# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""What every in-cluster agent shares: flags, logging, the Kubernetes client from flags.

Logging follows the charts' Log Options (manual Table 2.5): ``dir``,
``level`` (debug|info|warning|error|fatal), ``format`` (json|text),
``rotationTime`` and ``maxAge`` (durations in w/d/h). Logs always go to
stderr (``kubectl logs``) and, when a directory is given, to a rotated file.
"""

from __future__ import annotations

import argparse
import json
import logging
import logging.handlers
import os
import re
import signal
import sys
import threading
import time
from typing import Any, Optional

from ..errors import MetaxGpuError
from ..host import HostRoot
from ..kube.client import KubeClientError, api_client, core_v1
from ..kube.node import OwnNode


LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
              "error": logging.ERROR, "fatal": logging.CRITICAL}
_DURATION = re.compile(r"^\s*(\d+)\s*([wdh])\s*$")
_UNIT_SECONDS = {"w": 7 * 86400, "d": 86400, "h": 3600}


class UsageError(MetaxGpuError):
    """A flag or configuration value is invalid; the agent exits with this message."""


def parse_duration(text: str, option: str = "duration") -> int:
    """``1w`` / ``26w`` / ``3d`` / ``12h`` -> seconds (the charts' units)."""
    match = _DURATION.match(str(text))
    if not match or int(match.group(1)) == 0:
        raise UsageError("%s: %r is not a duration like 12h, 3d or 1w" % (option, text))
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


class JsonFormatter(logging.Formatter):
    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + "Z",
            "level": record.levelname.lower(),
            "component": self.component,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            entry.update(extra)
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, sort_keys=False, default=str)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0 (e.g. --healthy-interval, where 0 disables)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not an integer" % text)
    if value < 0:
        raise argparse.ArgumentTypeError("%d is negative" % value)
    return value


def positive_float(text: str) -> float:
    """argparse type: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % text)
    if value <= 0:
        raise argparse.ArgumentTypeError("%s must be positive" % text)
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a count)."""
    value = non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("%d must be at least 1" % value)
    return value


def tcp_port(text: str) -> int:
    """argparse type: 0..65535 (0 lets the kernel pick)."""
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError("%d is not a TCP port" % value)
    return value


def add_common_flags(parser: argparse.ArgumentParser, host_root: bool = True) -> None:
    """Flags every agent accepts (the chart passes the Log Options as these)."""
    if host_root:
        parser.add_argument("--host-root", default="/",
                            help="where the node's root is mounted (default /)")
        parser.add_argument("--host-prefix", default=None,
                            help="prefix of host paths handed to the kubelet (default: --host-root)")
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file; in-cluster configuration when absent")
    parser.add_argument("--log-dir", default="", help="directory for log files ('' = stderr only)")
    parser.add_argument("--log-level", default="info", choices=sorted(LOG_LEVELS))
    parser.add_argument("--log-format", default="json", choices=("json", "text"))
    parser.add_argument("--log-rotation-time", default="1w", help="rotate log files after (w/d/h)")
    parser.add_argument("--log-max-age", default="26w", help="delete rotated files older than (w/d/h)")


def setup_logging(component: str, args: argparse.Namespace) -> logging.Logger:
    rotation = parse_duration(args.log_rotation_time, "--log-rotation-time")
    max_age = parse_duration(args.log_max_age, "--log-max-age")
    if max_age < rotation:
        raise UsageError("--log-max-age (%s) is shorter than --log-rotation-time (%s)"
                         % (args.log_max_age, args.log_rotation_time))
    if args.log_format == "json":
        formatter: logging.Formatter = JsonFormatter(component)
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s " + component + " %(name)s: %(message)s")
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(formatter)
    root.addHandler(stream)
    if args.log_dir:
        try:
            os.makedirs(args.log_dir, exist_ok=True)
            handler = logging.handlers.TimedRotatingFileHandler(
                os.path.join(args.log_dir, component + ".log"), when="S", interval=rotation,
                backupCount=max(1, max_age // rotation), utc=True)
        except OSError as exc:
            raise UsageError("--log-dir %s: %s" % (args.log_dir, exc.strerror or exc))
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(LOG_LEVELS[args.log_level])
    return logging.getLogger(component)


def checked_host_root(args: argparse.Namespace, required: str) -> HostRoot:
    """The HostRoot of --host-root/--host-prefix; exits clearly when ``required`` is missing under it."""
    host = HostRoot(args.host_root, args.host_prefix)
    if not os.path.isdir(host.path):
        raise UsageError("--host-root %s: no such directory" % args.host_root)
    if not host.isdir(required):
        raise UsageError("--host-root %s: %s is missing (is the node's root mounted there?)"
                         % (args.host_root, host.join(required)))
    return host


def kube_api_client(kubeconfig: Optional[str]) -> Any:
    """An ApiClient from --kubeconfig, or the in-cluster service account; UsageError otherwise."""
    try:
        return api_client(kubeconfig)
    except KubeClientError as exc:
        raise UsageError(str(exc).replace("kubeconfig ", "--kubeconfig ", 1) if kubeconfig else str(exc))


def node_runtime_version(client: Any, node_name: str, attempts: int = 5, delay: float = 2.0) -> Optional[str]:
    """The Node's ``status.nodeInfo.containerRuntimeVersion`` (None when the apiserver does not answer)."""
    own = OwnNode(core_v1(client), node_name)
    for attempt in range(attempts):
        try:
            info = (own.read().get("status") or {}).get("nodeInfo")
            return info.get("containerRuntimeVersion") if isinstance(info, dict) else None
        except Exception as exc:  # pylint: disable=broad-except  # the client raises many kinds
            logging.getLogger("agents").warning("cannot read node %s (attempt %d of %d): %s",
                                                node_name, attempt + 1, attempts, exc)
            time.sleep(delay)
    return None


def seconds_since_start(stat: str, uptime: str, hertz: int) -> float:
    """How long ago a process began: ``/proc/<pid>/stat``'s start time (field 22, clock
    ticks after boot; counted after the command name, which may hold spaces and
    parentheses) against ``/proc/uptime``'s first number."""
    fields = stat[stat.rindex(")") + 2:].split()
    return max(0.0, float(uptime.split()[0]) - int(fields[19]) / float(hertz))


def process_age() -> Optional[float]:
    """Seconds since this process began (None where /proc does not tell). An agent logs it
    with its start: the interpreter and the imports, which the pod's API times (whole
    seconds, the container's start) cannot tell apart from the container's own start."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            return seconds_since_start(stat.read(), uptime.read(), os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def stop_event() -> threading.Event:
    """An Event set on SIGTERM/SIGINT, for graceful shutdown loops."""
    event = threading.Event()

    def _handler(signum, frame):  # pylint: disable=unused-argument
        event.set()

    signal.signal(signal.SIGTERM, _handler)
    signal.signal(signal.SIGINT, _handler)
    return event


def run_main(component: str, main) -> None:
    """Run an agent's main(); usage errors exit 2 with one clear line."""
    try:
        code = main()
    except UsageError as exc:
        sys.stderr.write("%s: error: %s\n" % (component, exc))
        code = 2
    raise SystemExit(code)
