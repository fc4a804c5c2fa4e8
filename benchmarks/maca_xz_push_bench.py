# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The vendor's .xz MACA image pushed three ways, in one run (issue 27).

    flock /tmp/metax-heavy.lock env PYTHONPATH=.build/collections \\
        .venv/bin/python benchmarks/maca_xz_push_bench.py [--gib 4] [--cases realistic,random] [--json FILE]

Per case (``realistic``: layers of real files from the venv and /usr, about
2.5x with gzip; ``random``: incompressible), one xz archive written like the
vendor's (docker save tar, manifest.json last, ``xz -T0``), 4 layers of which
one holds 5/8 of the size (4 GiB -> 2.5 GiB), then:

* decompression alone: ``xz -dc -T0`` in a pipe against Python's lzma;
* ``podman load -i FILE.xz`` + ``podman push`` (the manual's docker procedure);
* ``skopeo copy docker-archive:`` from the decompressed tar (and with the
  ``xz -d`` it needs first);
* ours from the ``.xz`` (gzip, zstd, none), peak RSS of our process and of xz,
  and the unchanged re-push.

Each tool pushes to a docker-registry of its own (Debian's, loopback).
Generated archives are kept in ``--work`` for the next run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, ".build", "collections"))
sys.path.insert(0, os.path.join(ROOT, "tests", "unit", "registry"))
sys.path.insert(0, HERE)

import realistic_image  # noqa: E402
from registry_fixtures import start_registry  # noqa: E402

REF = "cr.metax-tech.com/library/maca-c500:2.23.0.4"
MIB = 1 << 20


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def layer_sizes(total: int) -> list:
    big = total * 5 // 8
    rest = (total - big) // 3
    return [rest, rest, big, rest]   # the big one third, as in the manual's load log


def prepare(work: str, case: str, gib: float, level: int) -> dict:
    name = "%s-%sgib-xz%d" % (case, gib, level)
    tar = os.path.join(work, name + ".tar")
    xz = os.path.join(work, "maca-c500-container-2.23.0.4-ubuntu18.04-amd64-%s.xz" % name)
    meta = os.path.join(work, name + ".json")
    if not (os.path.exists(tar) and os.path.exists(xz) and os.path.exists(meta)):
        roots = [os.path.join(ROOT, ".venv", "lib"), "/usr"]
        secs, info = timed(lambda: realistic_image.docker_archive(
            tar, REF, layer_sizes(int(gib * (1 << 30))), roots=[os.path.realpath(r) for r in roots],
            random=case == "random"))
        xz_secs, _out = timed(lambda: realistic_image.xz_compress(tar, xz, level))
        info.update(generate_seconds=round(secs, 1), xz_seconds=round(xz_secs, 1))
        with open(meta, "w") as handle:
            json.dump(info, handle)
    with open(meta) as handle:
        info = json.load(handle)
    info.update(tar=tar, xz=xz, xz_size=os.path.getsize(xz))
    return info


def read_through(path: str, tool: str) -> float:
    from ansible_collections.metax.gpu.plugins.module_utils.registry import xzsource
    secs, _out = timed(lambda: _drain(xzsource.XzReader(path, tool)))
    return secs


def _drain(reader) -> None:
    with reader:
        reader.drain()


def ours(src: str, host: str, compression: str, cache: str, tool: str) -> dict:
    """One push in a child process: its own peak RSS and the peak RSS of its xz."""
    code = ("import json,resource,sys,time\n"
            "from ansible_collections.metax.gpu.plugins.module_utils.registry import api\n"
            "req=api.PushRequest(src=sys.argv[1],registry=sys.argv[2],plain_http=True,compression=sys.argv[3],"
            "cache_dir=sys.argv[4],xz_tool=sys.argv[5])\n"
            "t=time.perf_counter();r=api.push(req);s=time.perf_counter()-t\n"
            "hwm=[l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
            "print(json.dumps({'seconds':s,'result':r,'rss_kib':int(hwm),"
            "'child_rss_kib':resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, ".build", "collections"))
    out = subprocess.run([sys.executable, "-c", code, src, host, compression, cache, tool],
                         check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def podman(work: str, xz: str, host: str) -> dict:
    store = tempfile.mkdtemp(prefix="podman.", dir=work)
    base = ["podman", "--root", os.path.join(store, "root"), "--runroot", os.path.join(store, "run"),
            "--storage-driver", "overlay", "--cgroup-manager", "cgroupfs", "--events-backend", "none"]
    try:
        load, _out = timed(lambda: subprocess.run(base + ["load", "-q", "-i", xz], check=True, capture_output=True))
        push, _out = timed(lambda: subprocess.run(
            base + ["push", "-q", "--tls-verify=false", REF, "docker://%s/podman/maca-c500:2.23.0.4" % host],
            check=True, capture_output=True))
    finally:
        subprocess.run(base + ["rmi", "-a", "-f"], capture_output=True, check=False)
        shutil.rmtree(store, ignore_errors=True)
    return {"load": load, "push": push}


def skopeo(tar: str, host: str) -> float:
    secs, _out = timed(lambda: subprocess.run(
        ["skopeo", "copy", "-q", "--dest-tls-verify=false", "docker-archive:" + tar,
         "docker://%s/skopeo/maca-c500:2.23.0.4" % host], check=True, capture_output=True))
    return secs


def run_case(work: str, case: str, args) -> dict:
    gib = args.random_gib if case == "random" and args.random_gib else args.gib
    info = prepare(work, case, gib, args.xz_level)
    size = info["size"]
    mib = size / MIB
    out: dict = {"case": case, "uncompressed_mib": round(mib), "xz_mib": round(info["xz_size"] / MIB),
                 "xz_blocks": _blocks(info["xz"])}
    rows = []
    out["decompress"] = {tool: read_through(info["xz"], tool) for tool in ("xz", "python")}
    out["xz_d_to_tar"] = timed(lambda: subprocess.run(
        "xz -dc -T0 %s > %s" % (info["xz"], os.path.join(work, "scratch.tar")), shell=True, check=True))[0]
    os.unlink(os.path.join(work, "scratch.tar"))
    registries = []

    def registry(name: str):
        reg = start_registry(os.path.join(work, "reg-%s-%s" % (case, name)))
        registries.append(reg)
        return reg
    try:
        if not args.skip_podman:
            p = podman(work, info["xz"], registry("podman").host)
            rows.append(("podman load (.xz)", p["load"]))
            rows.append(("podman push (gzip)", p["push"]))
            rows.append(("podman load + push", p["load"] + p["push"]))
        sk = skopeo(info["tar"], registry("skopeo").host)
        rows.append(("skopeo copy docker-archive (gzip)", sk))
        rows.append(("xz -d + skopeo copy (gzip)", sk + out["xz_d_to_tar"]))
        for comp in args.compressions.split(","):
            cache = os.path.join(work, "cache-%s-%s" % (case, comp))
            shutil.rmtree(cache, ignore_errors=True)
            reg = registry("ours-" + comp)
            first = ours(info["xz"], reg.host + "/ours", comp, cache, "auto")
            art = first["result"]["artifacts"][0]
            again = ours(info["xz"], reg.host + "/ours", comp, cache, "auto")
            assert first["result"]["changed"] and not again["result"]["changed"]
            rows.append(("ours from .xz (%s)" % comp, first["seconds"]))
            out["ours_" + comp] = {"seconds": first["seconds"], "repush_seconds": again["seconds"],
                                   "bytes_uploaded": art["bytes_uploaded"],
                                   "rss_mib": first["rss_kib"] / 1024, "xz_rss_mib": first["child_rss_kib"] / 1024,
                                   "layers": art["layers"]}
        if "python" in args.tools:
            reg = registry("ours-lzma")
            lz = ours(info["xz"], reg.host + "/ours", "gzip", os.path.join(work, "cache-%s-lzma" % case), "python")
            shutil.rmtree(os.path.join(work, "cache-%s-lzma" % case), ignore_errors=True)
            rows.append(("ours from .xz (gzip, Python lzma)", lz["seconds"]))
    finally:
        for reg in registries:
            reg.stop()
            shutil.rmtree(reg.root, ignore_errors=True)
    out["rows"] = rows
    return out


def _blocks(path: str) -> int:
    text = subprocess.run(["xz", "--robot", "--list", path], check=True, capture_output=True, text=True).stdout
    return int([l for l in text.splitlines() if l.startswith("totals")][0].split("\t")[2])


def report(out: dict) -> None:
    mib = out["uncompressed_mib"]
    rows = dict(out["rows"])
    podman_total = rows.get("podman load + push")
    skopeo_base = rows["skopeo copy docker-archive (gzip)"]
    gz = out.get("ours_gzip")
    ratio = mib * MIB / gz["bytes_uploaded"] if gz else 0.0
    print("\ncase %s: %d MiB uncompressed in 4 layers, xz %d MiB (%.2fx, %d blocks); gzip ratio %.2fx; %d CPUs"
          % (out["case"], mib, out["xz_mib"], mib / max(1, out["xz_mib"]), out["xz_blocks"], ratio, os.cpu_count() or 0))
    for tool, secs in out["decompress"].items():
        label = "xz -dc -T0 pipe" if tool == "xz" else "Python lzma"
        print("  decompress only, %-24s %7.2f s %7.1f MiB/s" % (label, secs, mib / secs))
    print("  %-36s %9s %9s %12s %14s" % ("push", "seconds", "MiB/s", "vs podman", "vs skopeo"))
    for name, secs in out["rows"]:
        vs_podman = "%.2fx" % (podman_total / secs) if podman_total else "-"
        print("  %-36s %9.2f %9.1f %11s %13.2fx" % (name, secs, mib / secs, vs_podman, skopeo_base / secs))
    for comp in ("gzip", "zstd", "none"):
        o = out.get("ours_" + comp)
        if not o:
            continue
        big = max(o["layers"], key=lambda l: l["uncompressed"])
        print("  ours %-5s re-push %.3f s; peak RSS %.0f MiB (xz %.0f MiB); largest layer %.0f MiB at %.0f MiB/s "
              "-> a 9.5 GB layer in %.0f s" % (comp, o["repush_seconds"], o["rss_mib"], o["xz_rss_mib"],
                                               big["uncompressed"] / MIB, big["mib_per_s"],
                                               9.5e9 / MIB / max(big["mib_per_s"], 0.1)))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=4.0, help="uncompressed image size")
    parser.add_argument("--random-gib", type=float, default=0.0, help="size of the random case (default: --gib)")
    parser.add_argument("--cases", default="realistic,random")
    parser.add_argument("--compressions", default="gzip,zstd,none")
    parser.add_argument("--tools", default="xz,python", help="also push once with Python's lzma")
    parser.add_argument("--xz-level", type=int, default=6)
    parser.add_argument("--work", default="/var/tmp/metax-maca-bench")
    parser.add_argument("--skip-podman", action="store_true")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    results = []
    for case in args.cases.split(","):
        out = run_case(args.work, case, args)
        report(out)
        results.append(out)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)
    print("\nbenchmark process peak RSS %.0f MiB" % (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
