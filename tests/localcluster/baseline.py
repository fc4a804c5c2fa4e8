# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The baseline rule and teardown, as pure data: never remove what existed before.

`up` records, before it changes anything, what the machine had
(``<state>/baseline``: tracked paths, the files of /etc/kubernetes and
/var/lib/kubelet, kubepods cgroups, network namespaces, iptables chains,
ip_forward) and never overwrites a complete record. `down` observes the
machine (``Observed``, gathered at the edge) and ``plan_teardown`` decides
what to remove: what `up` made and the baseline did not list -- also after a
failed or interrupted `up` (a half-started cluster), and any number of times.
Without a recorded state only what carries the cluster's names or marker
goes (``plan_sweep``).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from .settings import CHAIN, CLUSTER_BRIDGE, CNI_NAME, NETNS_PREFIX, POD_BRIDGE, VETH_PREFIX, Settings

TABLES = ("filter", "nat", "mangle", "raw")
FILES = ("existed", "etc-files", "kubelet-files", "cgroups", "netns", "chains", "ip_forward")


@dataclass(frozen=True)
class Chain:
    tool: str  # iptables | ip6tables
    table: str
    name: str

    @property
    def tag(self) -> str:
        """The baseline's "chains" line: "<table> NAME", "6<table> NAME" for ip6tables."""
        return "%s%s %s" % ("6" if self.tool == "ip6tables" else "", self.table, self.name)


@dataclass(frozen=True)
class Baseline:
    existed: frozenset[str] = frozenset()
    etc_files: frozenset[str] = frozenset()  # "./pki/ca.crt" (find's relative form)
    kubelet_files: frozenset[str] = frozenset()
    cgroups: frozenset[str] = frozenset()
    netns: frozenset[str] = frozenset()
    chains: frozenset[str] = frozenset()  # Chain.tag
    ip_forward: str = ""
    complete: bool = False


@dataclass(frozen=True)
class Observed:
    """The machine as `down` (or `up`, before recording) finds it."""

    present: frozenset[str] = frozenset()  # tracked paths (Settings.tracked_paths) that exist
    etc_files: tuple[str, ...] = ()
    kubelet_files: tuple[str, ...] = ()
    cgroups: tuple[str, ...] = ()  # kubepods dirs and <cgroup>/<prefix>* dirs
    netns: tuple[str, ...] = ()
    chains: tuple[Chain, ...] = ()
    links: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ()
    ip_forward: str = ""
    state_exists: bool = True
    etc_marker: bool = False
    kubelet_marker: bool = False


# ---------------------------------------------------------------- recording
def record(settings: Settings, seen: Observed) -> Baseline:
    """What `up` records; kubepods cgroups only (the nodes' own cgroups cannot predate the cluster)."""
    return Baseline(
        existed=frozenset(p for p in settings.tracked_paths() if p in seen.present),
        etc_files=frozenset(seen.etc_files) if settings.kube_etc in seen.present else frozenset(),
        kubelet_files=frozenset(seen.kubelet_files) if settings.kubelet_dir in seen.present else frozenset(),
        cgroups=frozenset(c for c in seen.cgroups if posixpath.basename(c) == "kubepods"),
        netns=frozenset(seen.netns), chains=frozenset(c.tag for c in seen.chains),
        ip_forward=seen.ip_forward, complete=True)


def keep_existing(existing: Optional[Baseline]) -> bool:
    """The rule: a complete baseline is never overwritten (a failed up/down keeps the first one)."""
    return existing is not None and existing.complete


def render(b: Baseline, settings: Settings) -> dict[str, str]:
    """The baseline dir's files, as cluster.sh writes them (sorted lines)."""
    def lines(items: Sequence[str]) -> str:
        return "".join(i + "\n" for i in items)

    return {
        "existed": lines([p for p in settings.tracked_paths() if p in b.existed]),
        "etc-files": lines(sorted(b.etc_files)),
        "kubelet-files": lines(sorted(b.kubelet_files)),
        "cgroups": lines(sorted(b.cgroups)),
        "netns": lines(sorted(b.netns)),
        "chains": lines(_chain_order(b.chains)),
        "ip_forward": b.ip_forward + "\n" if b.ip_forward else "",
    }


def _chain_order(tags: frozenset[str]) -> list[str]:
    """cluster.sh lists per table (filter nat mangle raw) iptables then ip6tables, chains in -S order."""
    order = []
    for t in TABLES:
        order += sorted(x for x in tags if x.split(" ", 1)[0] == t)
        order += sorted(x for x in tags if x.split(" ", 1)[0] == "6" + t)
    return order


def parse(files: Mapping[str, str]) -> Baseline:
    """A baseline dir's files (missing ones as absent keys); "complete" marks a finished record."""
    def items(name: str) -> frozenset[str]:
        return frozenset(line for line in files.get(name, "").splitlines() if line)

    return Baseline(existed=items("existed"), etc_files=items("etc-files"), kubelet_files=items("kubelet-files"),
                    cgroups=items("cgroups"), netns=items("netns"), chains=items("chains"),
                    ip_forward=files.get("ip_forward", "").strip(), complete="complete" in files)


# ---------------------------------------------------------------- teardown
@dataclass(frozen=True)
class TeardownPlan:
    netns: tuple[str, ...] = ()
    unmount: tuple[str, ...] = ()  # per root, deepest first
    cgroups: tuple[str, ...] = ()
    links: tuple[str, ...] = ()
    chains: tuple[Chain, ...] = ()
    paths: tuple[str, ...] = ()  # rm -rf, in this order
    ip_forward: str = ""  # restore to this ("" = leave)
    warnings: tuple[str, ...] = field(default=())


def _new_entries(root: str, now: Sequence[str], before: frozenset[str]) -> list[str]:
    """The top-most entries below ROOT that the baseline did not list (removing them removes their contents).

    An entry that is an ancestor of a listed one stays even when itself unlisted (find always lists the
    parents of what it lists, so this only matters for a damaged record; cluster.sh would remove it).
    """
    def ancestor_of_listed(rel: str) -> bool:
        return any(b.startswith(rel + "/") for b in before)

    new = {rel for rel in now if rel not in before and not ancestor_of_listed(rel)}
    top = sorted(rel for rel in new if not any(rel.startswith(other + "/") for other in new))
    return [posixpath.join(root, rel[2:] if rel.startswith("./") else rel) for rel in top]


def _under(path: str, prefixes: Sequence[str]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def _ours_link(name: str) -> bool:
    return (name.startswith(VETH_PREFIX) and name[len(VETH_PREFIX):][:1].isdigit()) or name == CLUSTER_BRIDGE


def plan_teardown(settings: Settings, b: Baseline, seen: Observed) -> TeardownPlan:
    """`down` with a recorded state: remove what is there now and was not before (cluster.sh cmd_down)."""
    warnings = [] if b.complete else ["no baseline recorded in %s; removing only the cluster's own dirs"
                                      % settings.baseline_dir]
    netns = tuple(n for n in sorted(seen.netns)
                  if (n.startswith("cni-") or n.startswith(NETNS_PREFIX)) and n not in b.netns)
    roots = (settings.kubelet_dir, settings.state_dir, settings.run_dir, settings.sim_root)
    # per root in this order, deepest first within it (cluster.sh's unmount_under)
    unmount = tuple(m for r in roots for m in sorted((m for m in seen.mounts if _under(m, (r,))), reverse=True))
    cgroups = tuple(c for c in sorted(seen.cgroups) if c not in b.cgroups)
    links = tuple(n for n in seen.links if _ours_link(n) or n == POD_BRIDGE)
    chains = tuple(c for c in seen.chains
                   if c.name.startswith(CHAIN)
                   or (c.name.startswith(("KUBE-", "CNI-")) and c.tag not in b.chains))
    paths: list[str] = []
    for root, now, before in ((settings.kube_etc, seen.etc_files, b.etc_files),
                              (settings.kubelet_dir, seen.kubelet_files, b.kubelet_files)):
        if root not in seen.present:
            continue
        if root not in b.existed:
            paths.append(root)
        else:
            paths += _new_entries(root, now, before)
    for p in ("/var/log/pods", "/var/log/containers", "/var/lib/cni", settings.sim_parent, settings.run_dir,
              "/etc/cdi", "/run/cdi"):
        if p in seen.present and p not in b.existed and p not in paths:
            paths.append(p)
    # /run/netns goes when `up` made it and nothing but the removed namespaces was in it
    if "/run/netns" in seen.present and "/run/netns" not in b.existed and set(seen.netns) <= set(netns):
        paths.append("/run/netns")
    paths.append("/var/lib/cni/results/%s-*" % CNI_NAME)
    paths.append(settings.state_dir)
    return TeardownPlan(netns=netns, unmount=unmount, cgroups=cgroups, links=links, chains=chains,
                        paths=tuple(paths), ip_forward=b.ip_forward, warnings=tuple(warnings))


def plan_sweep(settings: Settings, seen: Observed) -> TeardownPlan:
    """`down` without a recorded state (a cluster killed without `down`): only what carries our names or marker."""
    paths = []
    if seen.etc_marker:
        paths.append(settings.kube_etc)
        if seen.kubelet_marker:
            paths.append(settings.kubelet_dir)
    unmount = tuple(sorted((m for m in seen.mounts if _under(m, (settings.kubelet_dir,))), reverse=True)) \
        if seen.etc_marker and seen.kubelet_marker else ()
    return TeardownPlan(
        netns=tuple(n for n in sorted(seen.netns) if n.startswith(NETNS_PREFIX)),
        unmount=unmount,
        links=tuple(n for n in seen.links if _ours_link(n)),
        chains=tuple(c for c in seen.chains if c.name.startswith(CHAIN)),
        paths=tuple(paths))


def plan_down(settings: Settings, b: Optional[Baseline], seen: Observed) -> TeardownPlan:
    return plan_teardown(settings, b or Baseline(), seen) if seen.state_exists else plan_sweep(settings, seen)


def violates_baseline(plan: TeardownPlan, b: Baseline, settings: Settings) -> list[str]:
    """What PLAN would remove that B says existed before (the rule: always empty)."""
    bad = []
    existed_files = [posixpath.join(settings.kube_etc, r[2:]) for r in b.etc_files]
    existed_files += [posixpath.join(settings.kubelet_dir, r[2:]) for r in b.kubelet_files]
    for p in plan.paths:
        if p in b.existed:
            bad.append(p)
        bad += [f for f in existed_files if f == p or f.startswith(p + "/")]
    bad += [n for n in plan.netns if n in b.netns]
    bad += [c for c in plan.cgroups if c in b.cgroups]
    bad += [c.tag for c in plan.chains if c.tag in b.chains and not c.name.startswith(CHAIN)]
    return bad
