# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Fixtures for tests against the local Kubernetes cluster.

Tests marked ``@pytest.mark.cluster`` use the session fixture ``cluster``.
When at least one selected test carries that marker, the cluster is brought
up once, right after collection (``scripts/cluster/cluster.sh up``: that step
is outside every test's timeout, a cold run builds Kubernetes first) and
brought down when the session ends, unless it was already up before the
session (then it is left running) or METAX_KEEP_CLUSTER=1.

Harness failures (``cluster.sh up`` failing, ``down`` failing) FAIL the
cluster tests whenever the cluster could run: as root, and always under CI
(env CI set and not false). Only a run that is not root outside CI skips
them; it then writes the reason to tests/output/cluster-skipped.txt, which the
closing summary of scripts/run-tests.sh prints in words.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from module_claims import ModuleClaims, claimed_run, module_groups  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER_SH = os.path.join(REPO, "scripts", "cluster", "cluster.sh")
LOG_DIR = os.path.join(REPO, "tests", "output")
UP_TIMEOUT = int(os.environ.get("METAX_CLUSTER_UP_TIMEOUT", "3600"))
# The nodes a test session brings up: three, so the multi-node tests run in
# CI (each extra node adds a few seconds to a warm cluster-up). A running
# cluster is reused only if it has these nodes and was started by this
# checkout with these cluster scripts.
TEST_NODES = os.environ.get("METAX_TEST_NODES", "8xC500 4xN100 2xC550-sriov")

# The cluster this session uses: "" for the machine's own, NAME inside scripts/cluster/sandbox.sh NAME
# (a second cluster beside it, in namespaces of its own). Each keeps its own logs and leases.
SANDBOX = os.environ.get("METAX_SANDBOX", "")

# what cluster.sh up logs when it takes down a cluster it may not reuse
REPLACED = "replacing the running cluster:"

_STATE = {"wanted": False, "tried": False, "ran_up": False, "error": None, "info": None, "was_up": False, "up_seconds": None,
          "needs_images": False, "early_build": None}


def in_ci():
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no", "off")


def pytest_configure(config):
    config.addinivalue_line("markers", "cluster: needs the local Kubernetes cluster (tests/integration)")


def must_run():
    """The cluster tests fail rather than skip on a harness error (root, or CI)."""
    return in_ci() or os.geteuid() == 0


SKIP_NOTE = os.path.join(LOG_DIR, "cluster-skipped.txt")


def _log_name(base):
    """cluster-up.log, or cluster-up-NAME.log for the sandbox NAME's cluster."""
    if not SANDBOX:
        return base
    stem, ext = os.path.splitext(base)
    return "%s-%s%s" % (stem, SANDBOX, ext)


def _note_skip(reason):
    os.makedirs(LOG_DIR, exist_ok=True)
    with open(SKIP_NOTE, "w") as fh:
        fh.write(reason + "\n")


def _write(config, line):
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)
    else:
        sys.stderr.write(line + "\n")


def _run_cluster(action, log_name, timeout, echo=None, nodes=None):
    """Run cluster.sh ACTION with its output in tests/output/LOG_NAME (and echoed)."""
    os.makedirs(LOG_DIR, exist_ok=True)
    path = os.path.join(LOG_DIR, log_name)
    start = time.time()
    lines = []
    with open(path, "w") as log:
        env = dict(os.environ)
        env.pop("NODES", None)
        if nodes:
            env["NODES"] = nodes
        proc = subprocess.Popen(["bash", CLUSTER_SH, action], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, cwd=REPO, text=True, errors="replace", env=env)
        watchdog = threading.Timer(timeout, proc.kill)
        watchdog.start()
        try:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                lines.append(line)
                if echo is not None and not line.startswith("go: downloading"):
                    echo("  | " + line.rstrip("\n"))
        finally:
            watchdog.cancel()
            proc.stdout.close()
            rc = proc.wait()
    if time.time() - start >= timeout:
        rc = "killed: timeout after %ss" % timeout
    return rc, "".join(lines), path, time.time() - start


def _tail(text, lines=25):
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _load_info():
    out = subprocess.run(["bash", CLUSTER_SH, "json"], stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, cwd=REPO, timeout=60, check=True).stdout
    return json.loads(out)


def _lease_dir():
    cache = os.environ.get("METAX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "metax-gpu")
    # per cluster: a sandbox's sessions see only their own PID namespace, so another cluster's
    # leases would look dead to them (and be removed)
    return os.path.join(cache, "cluster-leases" + ("-" + SANDBOX if SANDBOX else ""))


def _other_live_leases():
    """PIDs of other live test sessions using the cluster (several sessions may share one machine)."""
    others = []
    try:
        names = os.listdir(_lease_dir())
    except OSError:
        return others
    for name in names:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        if os.path.exists("/proc/%s" % name):
            others.append(int(name))
        else:
            try:
                os.unlink(os.path.join(_lease_dir(), name))
            except OSError:
                pass
    return others


def _take_lease():
    os.makedirs(_lease_dir(), exist_ok=True)
    with open(os.path.join(_lease_dir(), str(os.getpid())), "w") as fh:
        fh.write(" ".join(sys.argv) + "\n")


def _drop_lease():
    try:
        os.unlink(os.path.join(_lease_dir(), str(os.getpid())))
    except OSError:
        pass


def _state_dir():
    return os.environ.get("METAX_CLUSTER_DIR", "/var/lib/metax-gpu-cluster")


def _started_by_tests_marker():
    return os.path.join(_state_dir(), "started-by-tests")


def _bring_up(config):
    _STATE["tried"] = True
    _take_lease()
    if os.geteuid() != 0:
        _STATE["error"] = ("the local cluster needs root (it runs kubelet/containerd, mounts and writes "
                           "/etc/kubernetes); run the tests as root")
        return
    if not os.path.exists(CLUSTER_SH):
        _STATE["error"] = "%s is missing" % CLUSTER_SH
        return
    _start_image_build()
    status = subprocess.run(["bash", CLUSTER_SH, "status"], stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, cwd=REPO, timeout=120, check=False)
    _STATE["was_up"] = status.returncode == 0
    if _STATE["was_up"]:
        _write(config, "local cluster: already up; cluster.sh up checks whether this checkout may reuse it")
    else:
        _write(config, "local cluster: bringing it up (scripts/cluster/cluster.sh up; log: tests/output/%s; "
                       "a cold run installs packages and builds Kubernetes first)" % _log_name("cluster-up.log"))
    # cluster.sh up reuses a running cluster only when this checkout started
    # it, with these scripts and TEST_NODES; otherwise it replaces it and says
    # why (scripts/cluster/identity.py)
    rc, text, path, secs = _run_cluster("up", _log_name("cluster-up.log"), UP_TIMEOUT, echo=lambda l: _write(config, l),
                                        nodes=TEST_NODES)
    _STATE["ran_up"] = True
    _STATE["up_seconds"] = secs
    if REPLACED in text:
        _STATE["was_up"] = False  # this session brought up its own
        _write(config, "local cluster: the running one was not this checkout's; replaced (see the warning above)")
    elif _STATE["was_up"]:
        _write(config, "local cluster: reusing it (it will be left running)")
    if not _STATE["was_up"] and os.path.isdir(_state_dir()):
        # brought up by a test session: the last session using it stops it
        open(_started_by_tests_marker(), "w").close()
    if rc != 0:
        _STATE["error"] = "scripts/cluster/cluster.sh up failed (%s); see %s:\n%s" % (rc, path, _tail(text))
        return
    _write(config, "local cluster: up in %.0fs" % secs)
    try:
        _STATE["info"] = _load_info()
    except (subprocess.SubprocessError, ValueError) as exc:
        _STATE["error"] = "cannot read the cluster description (cluster.sh json): %s" % exc


# The cluster modules that mostly wait (timers, rollouts, a scheduler restart's fault window) run first,
# while the phases beside the cluster stream (run-tests.sh: unit, sanity, lint, the host-side
# integration tests) keep both cores busy; the ones that mostly compute (playbook runs: the driver
# upgrade, the site runs, driver-manager's rollouts) run after those phases are done. Measured over a
# whole run (ci-history, session 19): the waiting modules used 0.5-1.0 cores of two when alone, the
# computing ones ran 1.6-1.9 times slower beside the other phases. Modules not named keep file order,
# between the two; test_zz_cluster_down stays last.
WAITING_FIRST = (
    "test_scheduler_extender_cluster.py", "test_gpu_health_cluster.py", "test_vfio_cluster.py",
    "test_operator_cluster.py", "test_health_ladder_cluster.py", "test_maca_cluster.py",
    "test_mx_smi_fidelity_cluster.py", "test_runtime_class_cluster.py", "test_multi_node.py",
)
COMPUTING_LAST = (
    "test_driver_manager_cluster.py", "test_driver_upgrade_cluster.py", "test_e2e_site.py",
    "test_operator_site.py", "test_set_vfnum_cluster.py", "test_zz_cluster_down.py",
)


# Two cluster streams (run-tests.sh `all` as root, unless METAX_CLUSTER_STREAMS=1): one pytest on the
# machine's cluster (METAX_CLUSTER_MODULES=first) runs every cluster module; once the phases beside the
# cluster stream are done, one on a second cluster inside scripts/cluster/sandbox.sh
# (METAX_CLUSTER_MODULES=second) runs modules of EITHER_CLUSTER. Each of those runs once, in the stream
# that claims it first (module_claims.py, in METAX_CLUSTER_CLAIMS): the first stream takes them last,
# in the order below, the second from the back, so the two end together on a fast machine and a slow
# one alike. They wait (vfio, the health ladder) or are playbook modules of COMPUTING_LAST bound by
# latency at about one core: the second cluster runs them on the core that the first stream's tail
# leaves idle. Two streams from the start made the whole run CPU-bound on 2 cores (ci-history, session
# 23). Unset (or "all"): every cluster module, on one cluster, in the order above. A module here runs
# nothing of podman's (no route out of the sandbox, and its containers belong to the machine's stream).
EITHER_CLUSTER = (
    "test_health_ladder_cluster.py", "test_vfio_cluster.py", "test_driver_manager_cluster.py",
    "test_driver_upgrade_cluster.py", "test_set_vfnum_cluster.py",
)
CLUSTER_MODULES = os.environ.get("METAX_CLUSTER_MODULES", "all")
STREAMS = ("first", "second")


def _module_name(item):
    return os.path.basename(str(item.fspath))


def _in_this_stream(item):
    """Whether this session may run ITEM: every test not marked cluster; the second stream's cluster
    modules are those of EITHER_CLUSTER."""
    if CLUSTER_MODULES != "second" or item.get_closest_marker("cluster") is None:
        return True
    return _module_name(item) in EITHER_CLUSTER


def _module_rank(item):
    name = _module_name(item)
    if CLUSTER_MODULES in STREAMS and name in EITHER_CLUSTER:
        # shared: the first stream takes them after its own, the second from the back
        index = EITHER_CLUSTER.index(name)
        return (3, -index if CLUSTER_MODULES == "second" else index)
    if name == "test_zz_cluster_down.py":
        return (4, 0)
    if name in WAITING_FIRST:
        return (0, WAITING_FIRST.index(name))
    if name in COMPUTING_LAST:
        return (2, COMPUTING_LAST.index(name))
    return (1, 0)


def pytest_collection_modifyitems(session, config, items):
    """This stream's cluster modules, in the order above; a stable sort keeps each module's tests together
    and in order."""
    if CLUSTER_MODULES not in ("", "all") + STREAMS:
        raise pytest.UsageError("METAX_CLUSTER_MODULES must be all, first or second, not %r" % CLUSTER_MODULES)
    if CLUSTER_MODULES in STREAMS and not os.environ.get("METAX_CLUSTER_CLAIMS"):
        raise pytest.UsageError("METAX_CLUSTER_MODULES=%s needs METAX_CLUSTER_CLAIMS, the directory both streams "
                                "claim modules in" % CLUSTER_MODULES)
    kept, other = [], []
    for item in items:
        (kept if _in_this_stream(item) else other).append(item)
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = kept
    if any(item.get_closest_marker("cluster") is not None for item in items):
        items.sort(key=_module_rank)


def pytest_runtestloop(session):
    """In two streams, each module of EITHER_CLUSTER runs in the stream that claims it first; otherwise
    pytest's own loop."""
    if CLUSTER_MODULES not in STREAMS or session.config.option.collectonly:
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted("%d error(s) during collection" % session.testsfailed)
    claims = ModuleClaims(os.environ["METAX_CLUSTER_CLAIMS"])
    groups = module_groups(session.items, _module_name)
    for item, nextitem in claimed_run(groups, _module_name, EITHER_CLUSTER, claims.claim):
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
    return True


def pytest_collection_finish(session):
    wanted = any(item.get_closest_marker("cluster") is not None for item in session.items)
    _STATE["wanted"] = wanted
    _STATE["needs_images"] = any("agent_images" in getattr(item, "fixturenames", ()) for item in session.items)
    if wanted:
        # only a session with cluster tests says afresh whether they ran: the
        # one that runs the other integration tests beside it (run-tests.sh)
        # must not delete the note the cluster session writes
        try:
            os.unlink(SKIP_NOTE)
        except OSError:
            pass
    if wanted and not session.config.option.collectonly:
        _bring_up(session.config)
        if _STATE["error"]:
            if must_run():
                verdict = "the cluster tests will FAIL (root or CI: the cluster must run here)"
            else:
                verdict = "the cluster tests are SKIPPED (not root, not CI)"
                _note_skip(_STATE["error"])
            _write(session.config, "local cluster harness error: %s\n%s" % (_STATE["error"], verdict))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say in words, at the very end, that the cluster tests did not run and why (not only a skip count)."""
    if not _STATE["wanted"] or not _STATE["error"] or must_run():
        return
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "cluster" in getattr(r, "keywords", {})]
    terminalreporter.write_sep("=", "the local cluster tests did NOT run", red=True, bold=True)
    terminalreporter.write_line("%d cluster test(s) were SKIPPED, not passed: %s"
                                % (len(skipped), _STATE["error"]))
    terminalreporter.write_line("Run the tests as root (or under CI, where they fail instead) to run them.")


def pytest_sessionfinish(session, exitstatus):
    _finish_image_build(stop=True)
    if not _STATE["tried"]:
        return
    _drop_lease()
    if not _STATE["ran_up"]:
        return  # not root, or no cluster.sh: this session started nothing to stop
    others = _other_live_leases()
    if others:
        _write(session.config, "local cluster: left running, still used by test session(s) %s" % others)
        return
    if not os.path.exists(_started_by_tests_marker()):
        if _STATE["was_up"]:
            _write(session.config, "local cluster: left running (it was up before the tests); "
                                   "stop it with 'make cluster-down'")
            return
        if not os.path.isdir(_state_dir()):
            return  # already down (another session stopped it)
    if os.environ.get("METAX_KEEP_CLUSTER", "") not in ("", "0"):
        _write(session.config, "local cluster: left running (METAX_KEEP_CLUSTER); stop it with 'make cluster-down'")
        return
    rc, text, path, secs = _run_cluster("down", _log_name("cluster-down.log"), 600)
    if rc != 0:
        _write(session.config, "local cluster: 'cluster.sh down' FAILED (%s); see %s:\n%s" % (rc, path, _tail(text)))
        if must_run():
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    else:
        _write(session.config, "local cluster: down in %.0fs" % secs)


class Cluster(object):
    """What the tests need to reach the local cluster."""

    def __init__(self, info):
        self.info = info
        self.kubeconfig = info["KUBECONFIG"]
        self.kubectl_path = os.path.join(info["METAX_KUBE_BIN"], "kubectl")
        self.node_name = info["METAX_NODE_NAME"]
        self.apiserver = info["METAX_APISERVER"]
        self.registry = info["METAX_REGISTRY"]
        self.registry_auth = info["METAX_REGISTRY_AUTH"]
        self.registry_auth_user = info["METAX_REGISTRY_AUTH_USER"]
        self.registry_auth_password_file = info["METAX_REGISTRY_AUTH_PASSWORD_FILE"]
        self.registry_auth_ca = info["METAX_REGISTRY_AUTH_CA"]
        self.registry_auth_cert_dir = info["METAX_REGISTRY_AUTH_CERT_DIR"]
        self.sim_root = info["METAX_SIM_ROOT"]
        self.sim_preset = info["METAX_SIM_PRESET"]
        self.base_image = info["METAX_BASE_IMAGE"]
        self.scheduler_image = info["METAX_SCHEDULER_IMAGE"]
        # [{"name", "preset", "sim_root", "ip", "pod_cidr", "containerd_address", "kubelet_dir", "netns",
        #   "index", "control_plane"}, ...]; the first is the control-plane node (node_name)
        self.nodes = info.get("nodes") or []
        self.helm = info.get("METAX_HELM", "")

    def node(self, name):
        for node in self.nodes:
            if node["name"] == name:
                return node
        raise KeyError(name)

    def cluster_sh(self, *args, **kwargs):
        """Run scripts/cluster/cluster.sh ARGS (e.g. restart-kubelet NODE)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 300)
        return subprocess.run(["bash", CLUSTER_SH] + list(args), stdin=subprocess.DEVNULL, cwd=REPO,
                              check=False, **kwargs)

    @property
    def registry_auth_password(self):
        with open(self.registry_auth_password_file) as fh:
            return fh.read().strip()

    @property
    def env(self):
        """Environment for subprocesses (kubectl, podman, skopeo) using the cluster."""
        env = dict(os.environ)
        env.update({k: v for k, v in self.info.items() if v and isinstance(v, str)})
        # the same PATH as `eval "$(cluster.sh env)"`: kubectl, helm (the bastion's tools)
        tools = [self.info["METAX_KUBE_BIN"]] + ([os.path.dirname(self.helm)] if self.helm else [])
        env["PATH"] = os.pathsep.join(tools + [env.get("PATH", "")])
        return env

    def kubectl(self, *args, **kwargs):
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 120)
        check = kwargs.pop("check", False)
        if "input" not in kwargs:
            kwargs.setdefault("stdin", subprocess.DEVNULL)   # never wait on the terminal
        return subprocess.run([self.kubectl_path, "--kubeconfig", self.kubeconfig] + list(args),
                              env=self.env, check=check, **kwargs)

    def api_client(self):
        from kubernetes import client, config

        return config.new_client_from_config(config_file=self.kubeconfig, client_configuration=client.Configuration())

    # Node reads go through one API client kept for the session, not a kubectl process each: the
    # tests poll nodes every second or so, and a kubectl start costs about 90 ms of CPU.
    def _core(self):
        if _STATE.get("core") is None:
            from kubernetes import client

            _STATE["core"] = client.CoreV1Api(self.api_client())
        return _STATE["core"]

    def read_nodes(self):
        """Every Node as JSON (what ``kubectl get nodes -o json`` lists)."""
        from ansible_collections.metax.gpu.plugins.module_utils.kube.pages import raw_list

        return list(raw_list(self._core().list_node).items)

    def read_pods(self, namespace):
        """The pods of NAMESPACE as JSON."""
        from ansible_collections.metax.gpu.plugins.module_utils.kube.pages import raw_list

        return list(raw_list(self._core().list_namespaced_pod, namespace).items)

    def read_node(self, name, strict=False):
        """Node NAME as JSON; None when there is none, or (unless ``strict``) when the read failed: the
        callers poll, as they did over ``kubectl get`` whose failures read as nothing."""
        from kubernetes.client.exceptions import ApiException

        from ansible_collections.metax.gpu.plugins.module_utils.kube.pages import raw_get

        try:
            return raw_get(self._core().read_node, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            if strict:
                raise
        except Exception:  # pylint: disable=broad-except  # a connection blip, an answer that is not JSON
            if strict:
                raise
        return None


@pytest.fixture(scope="session")
def cluster(request):
    """The running local cluster (see module docstring)."""
    if not _STATE["tried"]:  # requested by a test that is not marked `cluster`
        _bring_up(request.config)
    if _STATE["error"]:
        if must_run():
            pytest.fail("local cluster harness: %s" % _STATE["error"], pytrace=False)
        pytest.skip("local cluster unavailable (not root, not CI, so skipped): %s" % _STATE["error"])
    return Cluster(_STATE["info"])


# One build per session. A fixture imported into a test module is registered again for that
# module, whatever its scope, so the build ran once per module (23 times in a CI run): defined
# here, every module shares one. The checkout does not change during a session, so every call
# returned the same refs anyway.
AGENT_BUILD = os.path.join(REPO, "files", "images", "agent", "build.sh")


EARLY_BUILD_LOG = os.path.join(LOG_DIR, _log_name("agent-images-early.log"))


def _start_image_build():
    """Build the agent images (``--no-push``) beside the cluster's start and the modules that need none.

    Every CI run builds them (its tree changed under plugins/), and the build held the first module
    that needed them for about 60 s. ``agent_images`` below still runs build.sh, which waits for this
    one on its lock, finds the images built and only pushes them; a failed early build is built
    again there, and reported there."""
    if not _STATE["needs_images"] or _STATE["early_build"] is not None or SANDBOX:
        # in a sandbox (no route out for the build's cached pip layer to miss): run-tests.sh built
        # them on the machine before this stream started
        return
    os.makedirs(LOG_DIR, exist_ok=True)
    with open(EARLY_BUILD_LOG, "w") as log:
        # its own process group: a session that ends first stops podman too, not only build.sh
        _STATE["early_build"] = subprocess.Popen([AGENT_BUILD, "--no-push"], stdin=subprocess.DEVNULL, stdout=log,
                                                 stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)


def _finish_image_build(stop=False):
    """Wait for the early build (``stop``: a session that ends before needing it does not wait for it)."""
    proc = _STATE["early_build"]
    if proc is None or proc.poll() is not None:
        return
    if stop:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60 if stop else 1800)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="session")
def agent_images(cluster):
    """Build (if its content changed) and push the agent images; NAME -> reference."""
    _finish_image_build()
    result = subprocess.run([AGENT_BUILD], env=cluster.env, capture_output=True, text=True, timeout=1800,
                            stdin=subprocess.DEVNULL, check=False)
    assert result.returncode == 0, "agent image build failed:\n%s%s" % (result.stdout, result.stderr[-3000:])
    return dict(line.split("=", 1) for line in result.stdout.split() if "=" in line)


@pytest.fixture(scope="session")
def images(agent_images):
    """The charts' ``registry`` and ``imageTag`` values for the images ``agent_images`` pushed."""
    prefix, tag = agent_images["operator-controller"].rsplit(":", 1)
    return {"registry": prefix.rsplit("/", 1)[0], "tag": tag}
