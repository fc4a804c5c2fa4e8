# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Draw a Grafana dashboard's panels from a Prometheus' answers to a PNG (tests only).

Not Grafana: each panel is one plot of its queries over the range asked
(time series as lines, stats as their latest value, tables as text), laid
out in the dashboard's rows, so a person can look at what the dashboard
would show.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=wrong-import-position

UNITS = {"percentunit": (100.0, "%"), "bytes": (1.0 / 2 ** 30, "GiB"), "watt": (1.0, "W"), "celsius": (1.0, "°C")}


def _range(port, expr, start, end, step):
    query = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    body = json.loads(urllib.request.urlopen("http://127.0.0.1:%d/api/v1/query_range?%s" % (port, query),
                                             timeout=30).read().decode())
    assert body["status"] == "success", body
    return body["data"]["result"]


def _legend(template, labels):
    text = template or ",".join("%s=%s" % kv for kv in sorted(labels.items()) if kv[0] != "__name__")
    for key, value in labels.items():
        text = text.replace("{{%s}}" % key, value)
    return text


def render(port, dashboard, path, node, seconds):
    """Write ``path``; returns the number of series drawn."""
    end = time.time()
    start = end - seconds
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    columns = 3
    rows = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(6 * columns, 3.2 * rows))
    drawn = 0
    for ax, panel in zip(axes.flat, panels):
        scale, unit = UNITS.get(panel["fieldConfig"]["defaults"].get("unit", ""), (1.0, ""))
        ax.set_title(panel["title"] + (" (%s)" % unit if unit else ""), fontsize=10)
        lines = 0
        for target in panel["targets"]:
            series = _range(port, target["expr"].replace("$node", node), start, end, max(1, int(seconds // 120)))
            for one in series:
                xs = [float(t) - end for t, _v in one["values"]]
                ys = [float(v) * scale for _t, v in one["values"]]
                label = _legend(target.get("legendFormat", ""), one["metric"])
                if panel["type"] == "stat":
                    ax.text(0.5, 0.5, "%.3g %s" % (ys[-1], unit), ha="center", va="center", fontsize=22)
                    ax.set_axis_off()
                elif panel["type"] == "table":
                    ax.set_axis_off()
                    ax.text(0.0, 1.0 - 0.1 * lines, label[:90], fontsize=7, va="top", family="monospace")
                else:
                    ax.plot(xs, ys, label=label[:40])
                drawn += 1
                lines += 1
        if panel["type"] == "timeseries":
            ax.set_xlabel("seconds", fontsize=8)
            ax.tick_params(labelsize=7)
            if len(ax.get_lines()) <= 10:
                ax.legend(fontsize=6, loc="upper left")
    for ax in list(axes.flat)[len(panels):]:
        ax.set_axis_off()
    fig.suptitle(dashboard["title"] + " - node " + node)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return drawn
