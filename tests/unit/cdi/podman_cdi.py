# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Running the real podman against a CDI spec directory of a test's own.

podman 4.3 (Debian 12) reads CDI specs only from /etc/cdi and /var/run/cdi
(containers.conf's ``cdi_spec_dirs`` came in 4.4). So each run happens in a
private mount namespace where the test's spec directory is bind-mounted on
/run/cdi and an empty one on /etc/cdi: the machine's directories, and
whatever other sessions put there, are neither read nor touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional, Sequence

import pytest

ROOT = Path(__file__).resolve().parents[3]
CONTAINERS_CONF = ROOT / "scripts" / "cluster" / "containers" / "containers.conf"
REGISTRIES_CONF = ROOT / "scripts" / "cluster" / "containers" / "registries.conf"
BASE_IMAGE = os.environ.get("METAX_BASE_IMAGE", "localhost/metax-gpu/base:bookworm")
CDI_DIRS = ("/run/cdi", "/etc/cdi")

_NAMESPACE_SCRIPT = (
    'mount --bind "$0" /run/cdi && { [ ! -d /etc/cdi ] || mount --bind "$1" /etc/cdi; } '
    '&& shift && exec "$@"')


def podman_env() -> dict:
    return dict(os.environ, CONTAINERS_CONF=str(CONTAINERS_CONF), CONTAINERS_REGISTRIES_CONF=str(REGISTRIES_CONF))


def _base_image_present() -> bool:
    if not shutil.which("podman"):
        return False
    proc = subprocess.run(["podman", "image", "exists", BASE_IMAGE], env=podman_env(), capture_output=True,
                          check=False)
    return proc.returncode == 0


def _can_run() -> Optional[str]:
    if os.geteuid() != 0:
        return "podman with CDI over simulated device nodes needs root (mknod, mount namespaces)"
    if not shutil.which("podman") or not shutil.which("unshare"):
        return "podman or unshare missing (requirements/system.txt)"
    if not _base_image_present():
        return "image %s missing (scripts/cluster/images.sh base, the deps phase)" % BASE_IMAGE
    return None


SKIP_REASON = _can_run()
needs_podman = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")


def in_cdi_namespace(spec_dir: str, argv: Sequence[str], empty_dir: str) -> List[str]:
    """``argv`` run with ``spec_dir`` as the only CDI spec directory the runtime sees."""
    # /run is a tmpfs: a missing /run/cdi is made once, empty (runtimes create it themselves)
    os.makedirs(CDI_DIRS[0], exist_ok=True)
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _NAMESPACE_SCRIPT,
            spec_dir, empty_dir] + list(argv)


def podman_run(spec_dir: str, run_args: Sequence[str], command: str, empty_dir: str,
               timeout: float = 120) -> subprocess.CompletedProcess:
    argv = ["podman", "run", "--rm", "--network", "none"] + list(run_args) + [BASE_IMAGE, "sh", "-c", command]
    return subprocess.run(in_cdi_namespace(spec_dir, argv, empty_dir), env=podman_env(), capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)


# What a container reports about itself: its DRM nodes, /dev/mxcd, MACA and environment.
PROBE = ("ls /dev/dri 2>/dev/null | tr '\\n' ' '; echo; "
         "[ -c /dev/mxcd ] && echo mxcd=yes || echo mxcd=no; "
         "cat /opt/maca/lib/libmxc-runtime64.so 2>/dev/null || echo no-maca; "
         "echo MACA_PATH=${MACA_PATH:-}; echo LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}; "
         "grep ' /opt/maca ' /proc/self/mountinfo | cut -d' ' -f6 | cut -d, -f1")
