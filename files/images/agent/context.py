"""The agent images and their build context, defined once.

Two builders read this file, and nothing else says which images there are or
what goes into their context:

* ``files/images/agent/build.sh`` (a source checkout: the local cluster's
  registry, tagged with the content hash printed by ``tag``);
* the ``metax.gpu.agent_images`` role (the bastion: tagged with the collection
  version, saved as archives, bundled).

Commands (ROOT is the collection root: a checkout or an installed collection):

  python3 context.py names [--json]                  the images, one a line (a JSON list)
  python3 context.py tag --helm HELM [--base-id ID]  12 hex digits: hash of the context and the base image ID
  python3 context.py assemble --helm HELM DIR        write the context into DIR

The context holds the Containerfile, the entrypoint, requirements/agents.txt,
collection/ (the collection files the agents import) and operator/ (what only
the operator-controller stage copies: helm, the chart it renders, its CRD).
The collection files are what git tracks or would track in a checkout
(untracked work included, ignored files such as .venv and caches excluded),
and every file but bytecode in an installed collection, which has no git.

Standard library only; Python 3.6 syntax (the role runs it with the
controller's Python).
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

# One Containerfile stage each (--target NAME); the order is the build order.
IMAGES = ("gpu-device", "gpu-label", "gpu-aware", "gpu-exporter", "driver-manager", "operator-controller",
          "container-runtime", "gpu-dra", "vfio-manager")

# The collection paths copied to collection/ (MANIFEST.json: an installed collection's galaxy.yml).
COLLECTION_PATHS = ("galaxy.yml", "MANIFEST.json", "meta", "plugins", "README.md", "LICENSE")
# What the operator-controller stage adds besides helm: destination directory -> collection path.
OPERATOR_PATHS = (("operator/charts/metax-gpu-extensions", "files/charts/metax-gpu-extensions"),
                  ("operator/crds/clusteroperator.yaml", "files/charts/metax-operator/crds/clusteroperator.yaml"))
SKIPPED_DIRS = ("__pycache__",)
SKIPPED_SUFFIXES = (".pyc", ".pyo")


class ContextError(Exception):
    """A file the context needs is missing."""


def _git_files(root, paths):
    """The files under PATHS git tracks or would track, or None when ROOT is not a git worktree's top."""
    try:
        top = subprocess.run(["git", "-C", root, "rev-parse", "--show-toplevel"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, universal_newlines=True, check=False)
    except OSError:
        return None
    # an installed collection inside someone's repository is not a checkout of this one
    if top.returncode != 0 or os.path.realpath(top.stdout.strip()) != os.path.realpath(root):
        return None
    out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--"]
                         + list(paths), stdout=subprocess.PIPE, check=True)
    return sorted(f for f in out.stdout.decode("utf-8").split("\0") if f)


def _walked_files(root, paths):
    """Every file under PATHS but bytecode (an installed collection)."""
    found = []
    for path in paths:
        full = os.path.join(root, path)
        if os.path.isfile(full):
            found.append(path)
            continue
        for dirpath, dirs, files in os.walk(full):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
            for name in files:
                if not name.endswith(SKIPPED_SUFFIXES):
                    found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(found)


def source_files(root, paths):
    """Collection-relative paths of the regular files under PATHS."""
    listed = _git_files(root, paths)
    if listed is None:
        listed = _walked_files(root, paths)
    return [f for f in listed if os.path.isfile(os.path.join(root, f))]


def find_helm(helm):
    """HELM as a path, or looked up on PATH."""
    path = helm if os.sep in helm else shutil.which(helm)
    if not path or not os.path.isfile(path):
        raise ContextError("%s is missing (the operator-controller image carries helm)" % helm)
    return os.path.abspath(path)


def manifest(root, helm):
    """(path in the context, source file) of every file of the context, sorted by the first."""
    entries = [("Containerfile", os.path.join(HERE, "Containerfile")),
               ("entrypoint", os.path.join(HERE, "entrypoint")),
               ("requirements/agents.txt", os.path.join(root, "requirements", "agents.txt")),
               ("operator/bin/helm", helm)]
    entries += [("collection/" + f, os.path.join(root, f)) for f in source_files(root, COLLECTION_PATHS)]
    for dest, path in OPERATOR_PATHS:
        if os.path.isfile(os.path.join(root, path)):
            entries.append((dest, os.path.join(root, path)))
        else:
            entries += [(dest + f[len(path):], os.path.join(root, f)) for f in source_files(root, [path])]
    for dest, src in entries:
        if not os.path.isfile(src):
            raise ContextError("%s is missing (context file %s)" % (src, dest))
    return sorted(entries)


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def content_tag(entries, base_id):
    """12 hex digits that change with any file of the context, its mode, or the base image."""
    digest = hashlib.sha256(("base %s\n" % base_id).encode("utf-8"))
    for dest, src in entries:
        executable = "x" if os.access(src, os.X_OK) else "-"
        digest.update(("%s %s %s\n" % (_sha256(src), executable, dest)).encode("utf-8"))
    return digest.hexdigest()[:12]


def assemble(entries, directory):
    """Copy the context into DIRECTORY (file modes kept, symlinks followed)."""
    for dest, src in entries:
        target = os.path.join(directory, dest)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(src, target)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--root", default=ROOT, help="the collection root (default: the one holding this file)")
    commands = parser.add_subparsers(dest="command")
    names = commands.add_parser("names", help="the images, one a line")
    names.add_argument("--json", action="store_true", help="as a JSON list")
    tag = commands.add_parser("tag", help="the content hash of the context")
    tag.add_argument("--helm", default="helm")
    tag.add_argument("--base-id", default="no-base", help="the base image's ID")
    build = commands.add_parser("assemble", help="write the context into DIR")
    build.add_argument("--helm", default="helm")
    build.add_argument("directory", metavar="DIR")
    args = parser.parse_args(argv)
    if args.command == "names":
        print(json.dumps(list(IMAGES)) if args.json else "\n".join(IMAGES))
        return 0
    if args.command not in ("tag", "assemble"):
        parser.error("a command is needed: names, tag or assemble")
    try:
        entries = manifest(os.path.abspath(args.root), find_helm(args.helm))
    except ContextError as exc:
        print("context.py: %s" % exc, file=sys.stderr)
        return 1
    if args.command == "tag":
        print(content_tag(entries, args.base_id))
    else:
        assemble(entries, args.directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
