# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""maca-manager, the MACA component's agent, as its own process over simulated nodes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from agent_process import agent_env

from ansible_collections.metax.gpu.plugins.module_utils.sim.maca import PRODUCT_FILE, write_tree

MODULE = "ansible_collections.metax.gpu.plugins.module_utils.agents.maca_manager"
IMAGES = ("127.0.0.1:5000/metax-gpu/maca-n100:2.18.0.3", "127.0.0.1:5000/metax-gpu/maca-c500:2.18.0.3")


def payloads(tmp_path, version="2.18.0.3"):
    """The image volumes as the chart mounts them: <dir>/<index>/opt/maca."""
    root = tmp_path / "payloads"
    for index, product in enumerate(("N100", "C500")):
        write_tree(str(root / str(index) / "opt" / "maca"), version, product=product)
    return str(root)


def start(host, payload_dir, ready, images=IMAGES, stderr=subprocess.PIPE):
    args = [sys.executable, "-m", MODULE, "--host-root", host.path, "--log-format", "text", "--log-dir", "",
            "--payload-dir", payload_dir, "--ready-file", str(ready), "--interval", "0.2"]
    for image in images:
        args += ["--image", image]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, text=True, env=agent_env())


def wait_for(proc, predicate, timeout=60.0):
    """``predicate()``, once it holds or the process ended (generous: a loaded machine starts Python slowly)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate() or proc.poll() is not None:
            break
        time.sleep(0.05)
    return predicate()


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return err


def test_each_node_gets_its_products_payload_switched_then_ready(make_node, tmp_path):
    payload_dir = payloads(tmp_path)
    for preset, product in (("4xN100", "N100"), ("2xC550-sriov", "C500")):
        host = make_node(preset)
        ready = tmp_path / ("ready-" + preset)
        proc = start(host, payload_dir, ready)
        try:
            assert wait_for(proc, ready.exists), proc.communicate(timeout=5)
            assert ready.read_text() == "2.18.0.3\n"
            assert os.readlink(host.join("opt/maca")) == "maca-2.18.0.3"
            with open(host.join("opt/maca/" + PRODUCT_FILE)) as handle:
                assert handle.read() == product + "\n"
        finally:
            err = stop(proc)
        # the pod's readiness goes with it; the node keeps its MXMACA
        assert not ready.exists() and os.path.isdir(host.join("opt/maca-2.18.0.3"))
        assert "MXMACA 2.18.0.3 from %s active" % IMAGES[0 if product == "N100" else 1] in err


def test_a_node_no_payload_fits_is_not_ready_and_retried_with_backoff(make_node, tmp_path):
    host = make_node("4xN100")
    ready = tmp_path / "ready"
    log = tmp_path / "agent.log"
    with open(str(log), "w") as handle:
        proc = start(host, payloads(tmp_path), ready, images=[IMAGES[1], "127.0.0.1:5000/metax-gpu/maca-c600:2.18.0.3"],
                     stderr=handle)
    try:
        # from the first refusal on (a loaded machine may take seconds to start the agent), 3 s of retries
        assert wait_for(proc, lambda: "no MXMACA payload for MXN100" in log.read_text()), log.read_text()
        time.sleep(3)
        assert proc.poll() is None and not ready.exists()
        assert not os.path.lexists(host.join("opt/maca"))
    finally:
        stop(proc)
    err = log.read_text()
    # retried with backoff (2 s, 4 s, ...), not every --interval (0.2 s: some 15 times in 3 s)
    assert 1 <= err.count("no MXMACA payload for MXN100") < 5, err
