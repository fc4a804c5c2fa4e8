"""Read a Prometheus text exposition back into samples (tests only)."""
from __future__ import annotations

import re
import shutil
import subprocess

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text):
    """[(name, {label: value}, float)] of every sample line."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        found = _SAMPLE.match(line)
        assert found, "not a sample line: %r" % line
        labels = dict(_LABEL.findall(found.group(2) or ""))
        out.append((found.group(1), labels, float(found.group(3))))
    return out


def series(text, name, **match):
    """{bdf or '': value} of metric ``name`` whose labels include ``match``."""
    return {labels.get("bdf", ""): value for metric, labels, value in samples(text)
            if metric == name and all(labels.get(k) == v for k, v in match.items())}


def promtool_check(text):
    """(returncode, output) of ``promtool check metrics`` on ``text``."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: Debian's prometheus package (requirements/system.txt; scripts/deps.sh)"
    proc = subprocess.run([promtool, "check", "metrics"], input=text.encode(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=60, check=False)
    return proc.returncode, proc.stdout.decode()


# promtool's lint of mx-exporter's own names and labels (deviceId, modelName, Hostname;
# mx_memory_total and mx_ecc_error_count are gauges): kept as they are, since dashboards made for the real product query them
_MX_LINT = re.compile(r"^mx_[a-z_]+ (label names should be written in 'snake_case' not 'camelCase'|"
                      r"non-counter metrics should not have \"_total\" suffix|"
                      r"non-histogram and non-summary metrics should not have \"_count\" suffix)$")


def promtool_check_mx(text):
    """(ok, other output): ``promtool check metrics`` finds nothing but the mx-exporter names' lint."""
    rc, output = promtool_check(text)
    other = [line for line in output.splitlines() if line.strip() and not _MX_LINT.match(line.strip())]
    # 3: lint findings only (1 would be a parse error)
    return rc in (0, 3) and not other and (rc == 0 or output.strip() != ""), "\n".join(other) or output
