"""Wrap files into a single-layer OCI image archive (OCI image layout in a tar).

Used for the local cluster's pause image: no base image and no registry on the
internet are needed. The archive can be imported with
``ctr -n k8s.io images import`` (the name comes from the
``io.containerd.image.name`` annotation) or pushed with
``skopeo copy oci-archive:FILE docker://REGISTRY/NAME:TAG``.

The output is reproducible: fixed mtimes, owners and ordering.

Usage:
  oci_image.py --ref 127.0.0.1:5000/metax-gpu/pause:3.10 --out pause.tar \
      --entrypoint /pause --file build/pause:/pause:0755
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"


def _digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _add_bytes(tar, name, data, mode=0o644):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar, name):
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    tar.addfile(info)


def build_layer(files):
    """files: list of (source path, destination path in image, mode)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = set()
        for _src, dest, _mode in files:
            parts = dest.strip("/").split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        for d in sorted(dirs):
            _add_dir(tar, d)
        for src, dest, mode in sorted(files, key=lambda f: f[1]):
            with open(src, "rb") as fh:
                _add_bytes(tar, dest.strip("/"), fh.read(), mode)
    diff = raw.getvalue()
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0) as zf:
        zf.write(diff)
    return diff, gz.getvalue()


def build_archive(ref, out, files, entrypoint, cmd, env, labels):
    diff, layer = build_layer(files)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": entrypoint or None,
            "Cmd": cmd or None,
            "Env": env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Labels": labels or None,
        },
        "rootfs": {"type": "layers", "diff_ids": [_digest(diff)]},
        "history": [{"created_by": "metax.gpu scripts/cluster/oci_image.py"}],
    }
    config["config"] = {k: v for k, v in config["config"].items() if v is not None}
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": _digest(config_bytes), "size": len(config_bytes)},
        "layers": [{"mediaType": MEDIA_LAYER, "digest": _digest(layer), "size": len(layer)}],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else "latest"
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [{
            "mediaType": MEDIA_MANIFEST,
            "digest": _digest(manifest_bytes),
            "size": len(manifest_bytes),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {
                "io.containerd.image.name": ref,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    }
    tmp = out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        _add_dir(tar, "blobs")
        _add_dir(tar, "blobs/sha256")
        for blob in (layer, config_bytes, manifest_bytes):
            _add_bytes(tar, "blobs/sha256/" + _digest(blob).split(":", 1)[1], blob)
        _add_bytes(tar, "index.json", json.dumps(index, sort_keys=True).encode())
    os.replace(tmp, out)
    return _digest(manifest_bytes)


def _parse_file(spec):
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1].startswith("/"):
        raise argparse.ArgumentTypeError("expected SRC:/DEST[:MODE], got %r" % spec)
    mode = int(parts[2], 8) if len(parts) == 3 else 0o755
    if not os.path.isfile(parts[0]):
        raise argparse.ArgumentTypeError("no such file: %s" % parts[0])
    return parts[0], parts[1], mode


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--ref", required=True, help="full image reference, e.g. 127.0.0.1:5000/x/pause:3.10")
    ap.add_argument("--out", required=True, help="archive to write (OCI layout tar)")
    ap.add_argument("--file", action="append", type=_parse_file, default=[], help="SRC:/DEST[:MODE]")
    ap.add_argument("--entrypoint", action="append", default=[])
    ap.add_argument("--cmd", action="append", default=[])
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--label", action="append", default=[], help="KEY=VALUE")
    args = ap.parse_args(argv)
    if not args.file:
        ap.error("at least one --file is needed")
    labels = dict(item.split("=", 1) for item in args.label)
    digest = build_archive(args.ref, args.out, args.file, args.entrypoint, args.cmd, args.env, labels)
    print(digest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
