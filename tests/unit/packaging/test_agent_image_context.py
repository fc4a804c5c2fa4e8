"""The agent images and their build context are defined once, in files/images/agent/context.py.

The agent_images role and files/images/agent/build.sh both ask context.py for the
image names and for the context; neither holds a list or a copy step of its own.
"""
from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
AGENT = os.path.join(ROOT, "files", "images", "agent")
SCRIPT = os.path.join(AGENT, "context.py")
BUILD_SH = os.path.join(AGENT, "build.sh")
ROLE = os.path.join(ROOT, "roles", "agent_images")


def _load():
    spec = importlib.util.spec_from_file_location("agent_image_context", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


context = _load()


def _yaml(*parts):
    with open(os.path.join(ROLE, *parts)) as handle:
        return yaml.safe_load(handle)


def _role_task(name):
    for task in _yaml("tasks", "main.yml"):
        for inner in [task] + task.get("block", []):
            if inner.get("name") == name:
                return inner
    raise AssertionError("no task %r in roles/agent_images/tasks/main.yml" % name)


def _render(arg):
    """The role's argv with its variables: the collection root and the script as vars/main.yml sets them."""
    return (arg.replace("{{ ansible_playbook_python }}", sys.executable)
            .replace("{{ agent_images_context_script }}", SCRIPT)
            .replace("{{ agent_images_collection_root }}", ROOT))


def _run(argv):
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout


# -- the image list -----------------------------------------------------------

def test_the_role_reads_the_names_from_context_py():
    task = _role_task("Read the agent images (files/images/agent/context.py, which build.sh reads too)")
    argv = [_render(a) for a in task["ansible.builtin.command"]["argv"]]
    assert json.loads(_run(argv)) == list(context.IMAGES)
    assert task["check_mode"] is False      # check mode still knows the images
    setter = _role_task("Choose the builder")["ansible.builtin.set_fact"]
    assert setter["agent_images_names"] == "{{ agent_images_names_read.stdout | from_json }}"
    assert _yaml("vars", "main.yml")["agent_images_context_script"] == (
        "{{ agent_images_collection_root }}/files/images/agent/context.py")


def test_build_sh_reads_the_names_from_context_py():
    text = open(BUILD_SH).read()
    assert re.search(r'^CONTEXT=\(nice "\$\{PYTHON\}" "\$\{HERE\}/context\.py" --root "\$\{REPO_ROOT\}"\)$', text, re.M)
    assert re.search(r'^mapfile -t NAMES < <\("\$\{CONTEXT\[@\]\}" names\)$', text, re.M)
    assert len(re.findall(r"\bNAMES=", text)) == 0, "build.sh assigns its own image list"
    lines = _run([sys.executable, SCRIPT, "--root", ROOT, "names"]).split()
    assert lines == list(context.IMAGES)


@pytest.mark.parametrize("path", [BUILD_SH, os.path.join(ROLE, "vars", "main.yml"), os.path.join(ROLE, "tasks", "main.yml"),
                                  os.path.join(ROLE, "defaults", "main.yml")])
def test_no_second_list_of_images(path):
    """A line naming two images or more is a list of them (one image named for its own reason is not)."""
    for number, line in enumerate(open(path).read().splitlines(), 1):
        named = [name for name in context.IMAGES if re.search(r"(?<![\w-])%s(?![\w-])" % name, line)]
        assert len(named) < 2, "%s:%d lists %s: the list lives in context.py" % (os.path.relpath(path, ROOT), number, named)


def test_every_image_is_a_containerfile_stage_with_its_entrypoint():
    text = open(os.path.join(AGENT, "Containerfile")).read()
    stages = re.findall(r"^FROM \S+ AS (\S+)$", text, re.M)
    assert set(stages) - {"agents", "combined"} == set(context.IMAGES)
    links = re.search(r"for name in ([^;]+); do ln -s metax-agent", text).group(1).split()
    assert set(context.IMAGES) <= set(links)
    for name in context.IMAGES:
        assert 'ENTRYPOINT ["/usr/local/bin/%s"]' % name in text


# -- the context --------------------------------------------------------------

def test_the_role_and_build_sh_assemble_with_context_py():
    argv = _role_task("Write the build context")["ansible.builtin.command"]["argv"]
    assert [_render(a) for a in argv[:5]] == [sys.executable, SCRIPT, "--root", ROOT, "assemble"]
    assert argv[5:] == ["--helm", "{{ agent_images_helm_binary }}", "{{ agent_images_ctx.path }}"]
    build = _role_task("Build the agent images")["ansible.builtin.command"]["argv"]
    assert "agent_images_ctx.path ~ '/Containerfile'" in build        # the context's own Containerfile
    text = open(BUILD_SH).read()
    assert '"${CONTEXT[@]}" assemble --helm "${HELM_BIN}" "${ctx}"' in text
    assert '"${CONTEXT[@]}" tag --helm "${HELM_BIN}" --base-id "${base_id}"' in text
    assert '-f "${ctx}/Containerfile"' in text
    # nothing else copies into the context
    for path in (BUILD_SH, os.path.join(ROLE, "tasks", "main.yml")):
        body = open(path).read()
        assert "operator/charts" not in body and "agents.txt" not in body, path


def test_the_role_hashes_the_context_as_build_sh_tags_it_and_skips_current_images():
    """The role labels its images with context.py's hash (build.sh's tag) and builds nothing when every
    image already carries it: a second site run on the bastion does not rebuild ten images from the cache."""
    argv = _role_task("Hash the build context")["ansible.builtin.command"]["argv"]
    assert [_render(a) for a in argv[:5]] == [sys.executable, SCRIPT, "--root", ROOT, "tag"]
    assert argv[5:8] == ["--helm", "{{ agent_images_helm_binary }}", "--base-id"]
    assert "agent_images_base.stdout" in argv[8]          # the base image's ID, as build.sh passes it
    build = _role_task("Build the agent images")
    assert "'CONTENT=' ~ (agent_images_content.stdout | trim)" in build["ansible.builtin.command"]["argv"]
    content = re.search(r'^ARG CONTENT=.*\n(?:.*\n)*?.*org\.metax-gpu\.content="\$\{CONTENT\}"',
                        open(os.path.join(AGENT, "Containerfile")).read(), re.M)
    assert content, "the Containerfile no longer labels the images with CONTENT"
    # what is skipped when the images are current, and what is not
    for name in ("Make the build context", "Write the build context", "Build the agent images",
                 "Read the image IDs and content labels after the build"):
        assert _role_task(name)["when"] == "not agent_images_current", name
    for name in ("Hash the build context", "Read the image IDs and content labels before the build",
                 "Find the existing image archives", "Save the changed images as docker-archives"):
        assert "agent_images_current" not in str(_role_task(name).get("when", "")), name
    # the archives are looked up in one module run that reads no file whole (their checksums cost 8-9 s)
    archives = _role_task("Find the existing image archives")
    assert archives["ansible.builtin.find"]["get_checksum"] is False and "loop" not in archives
    # before the build, one module run reads every image (a run each cost a site run about 4.4 s);
    # after it, one run per image: the archives below are saved per image that changed
    before = _role_task("Read the image IDs and content labels before the build")
    after = _role_task("Read the image IDs and content labels after the build")
    assert "loop" not in before and "agent_images_names" in before["ansible.builtin.shell"]["cmd"]
    assert "agent_images_commands[agent_images_tool].id_content | map('quote')" in before["ansible.builtin.shell"]["cmd"]
    assert ".id_content" in after["ansible.builtin.command"]["argv"] and after["loop"] == "{{ agent_images_names }}"
    assert "agent_images_before_read[item]" in after["changed_when"]
    commands = _yaml("vars", "main.yml")["agent_images_commands"]
    for tool, cmd in commands.items():
        assert cmd["id_content"][:-1] == cmd["id"][:-1], tool          # the same inspect, one more field
        assert cmd["id_content"][-1].startswith(cmd["id"][-1] + " "), tool
        assert '"org.metax-gpu.content"' in cmd["id_content"][-1], tool
    decide = _role_task("Decide whether the images are current")["ansible.builtin.set_fact"]
    assert "'missing'" in decide["agent_images_current"] and "agent_images_content.stdout | trim" in decide["agent_images_current"]


# A stand-in for the builder (the one stand-in here): each image reference it knows prints its "ID CONTENT",
# the others are missing (podman's and docker's exit 125 and message on stderr); every call is logged.
FAKE_BUILDER = """#!%s
import json, os, sys
with open(os.environ["FAKE_IMAGES"]) as handle:
    images = json.load(handle)
with open(os.environ["FAKE_CALLS"], "a") as handle:
    handle.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[-1] not in images:
    sys.stderr.write("Error: %%s: image not known\\n" %% sys.argv[-1])
    sys.exit(125)
print(images[sys.argv[-1]])
"""

HASH = "abc123def456"
COUNT = 3
ALL_CURRENT = {i: "sha256:%d %s" % (i, HASH) for i in range(COUNT)}
# (case, {image index: "ID CONTENT" before the build, absent: missing}, {image index: after the build}, current)
CURRENT_CASES = [
    ("all-current", ALL_CURRENT, {}, True),
    ("one-missing", {i: "sha256:%d %s" % (i, HASH) for i in range(1, COUNT)}, {0: "sha256:10 " + HASH}, False),
    ("built-before-the-label", {**ALL_CURRENT, 1: "sha256:1 "},
     {1: "sha256:11 " + HASH}, False),
    ("another-content", {**ALL_CURRENT, COUNT - 1: "sha256:99 %s7" % HASH},
     {COUNT - 1: "sha256:19 " + HASH}, False),
    ("the-old-label-the-version", {i: "sha256:%d 0.1.0" % i for i in range(COUNT)},
     {i: "sha256:%d %s" % (i + 10, HASH) for i in range(COUNT)}, False),
    ("all-missing", {}, {i: "sha256:%d %s" % (i, HASH) for i in range(COUNT)}, False),
    ("rebuilt-the-same", {i: "sha256:%d" % i for i in range(COUNT)}, {}, False),     # no label: built, nothing new
]


def test_the_role_reads_every_image_in_one_run_and_calls_them_current_only_when_each_carries_the_hash(tmp_path):
    """The role's own three tasks (read before, decide, read after), run by ansible-playbook against a stand-in
    builder: current only when every image exists with the context's hash as its content label, and after a
    build exactly the images whose inspect changed are changed (their archives are saved again). Every case
    with podman, the commands of buildah and docker in two; the first three images (the tasks take any list:
    ansible-playbook runs each module once per image after a build)."""
    tasks = [_role_task(name) for name in ("Read the image IDs and content labels before the build",
                                           "Decide whether the images are current")]
    after = _role_task("Read the image IDs and content labels after the build")
    commands = _yaml("vars", "main.yml")["agent_images_commands"]
    registry, tag = "reg.example:5000/my project", "1.0.0;x"     # quoted into the shell, not split by it
    names = list(context.IMAGES)[:COUNT]
    ref = "%s/%%s:%s" % (registry, tag)
    runs = [(tool, case) for tool in ("podman", "buildah", "docker") for case in CURRENT_CASES
            if tool == "podman" or case[0] in ("all-current", "one-missing")]
    plays = []
    for tool, (case, before_images, built, _current) in runs:
        fake = tmp_path / tool
        if not fake.exists():
            fake.mkdir()
            (fake / tool).write_text(FAKE_BUILDER % sys.executable)
            os.chmod(str(fake / tool), 0o755)
        state = tmp_path / ("%s-%s.json" % (tool, case))
        state.write_text(json.dumps({ref % names[i]: out for i, out in before_images.items()}))
        # the build: the images the builder knows after it (a task environment, not a task that writes them)
        built_state = tmp_path / ("%s-%s-built.json" % (tool, case))
        built_state.write_text(json.dumps({ref % names[i]: out for i, out in {**before_images, **built}.items()}))
        environment = {"PATH": "%s:%s" % (fake, os.environ["PATH"]), "FAKE_CALLS": "%s.calls" % state}
        plays.append({
            "name": case, "hosts": "localhost", "gather_facts": False,
            "environment": dict(environment, FAKE_IMAGES=str(state)),
            "vars": {"agent_images_names": names, "agent_images_tool": tool, "agent_images_registry": registry,
                     "agent_images_effective_tag": tag, "agent_images_content": {"stdout": HASH + "\n"},
                     "agent_images_commands": commands},
            "tasks": tasks + [
                dict(after, environment=dict(environment, FAKE_IMAGES=str(built_state))),
                {"ansible.builtin.debug": {"msg": "CASE %s-%s {{ agent_images_current }} {{ agent_images_after.results"
                                                  " | select('changed') | map(attribute='item') | join(',') }}"
                                                  % (tool, case)}}]})
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(plays))
    exe = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    out = subprocess.run([exe, "-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=" + sys.executable,
                          str(path)], capture_output=True, text=True, check=True, timeout=600).stdout
    verdicts = {case: (current, changed) for case, current, changed in
                re.findall(r'"msg": "CASE (\S+) (True|False) ?([^"]*)"', out)}
    assert len(verdicts) == len(runs), out
    for tool, (case, before_images, built, current) in runs:
        changed = [names[i] for i in range(COUNT) if not current and before_images.get(i) != {**before_images, **built}.get(i)]
        assert verdicts["%s-%s" % (tool, case)] == (str(current), ",".join(changed)), (tool, case, out)
        # the format's Jinja escape as ansible renders it: {{ '{{' }} is {{
        command = [word.replace("{{ '{{' }}", "{{").replace("{{ '}}' }}", "}}") for word in commands[tool]["id_content"]]
        calls = [json.loads(line) for line in (tmp_path / ("%s-%s.json.calls" % (tool, case))).read_text().splitlines()]
        # one inspect per image before the build (in one module run), and again after it when one is not current
        assert calls == [command[1:] + [ref % name] for name in names] * (1 if current else 2), (tool, case)


def _fake_collection(root, helm_dir):
    files = {
        "galaxy.yml": "namespace: metax\nname: gpu\nversion: 1.0.0\n",
        "README.md": "readme\n", "LICENSE": "license\n", "meta/runtime.yml": "requires_ansible: '>=2.16.0'\n",
        "plugins/module_utils/names.py": "X = 1\n", "plugins/module_utils/__pycache__/names.cpython-311.pyc": "bytecode",
        "plugins/modules/stale.pyc": "bytecode", "requirements/agents.txt": "kubernetes\n",
        "files/charts/metax-gpu-extensions/Chart.yaml": "name: metax-gpu-extensions\n",
        "files/charts/metax-gpu-extensions/templates/a.yaml": "a: 1\n",
        "files/charts/metax-operator/crds/clusteroperator.yaml": "kind: CustomResourceDefinition\n",
        "files/charts/metax-operator/values.yaml": "not: carried\n",
        "tests/unit/test_x.py": "not carried\n",
    }
    for rel, body in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(body)
    helm = os.path.join(helm_dir, "helm")
    with open(helm, "w") as handle:
        handle.write("#!/bin/sh\n")
    os.chmod(helm, 0o755)
    return helm


EXPECTED = {
    "Containerfile", "entrypoint", "requirements/agents.txt", "operator/bin/helm",
    "collection/galaxy.yml", "collection/README.md", "collection/LICENSE", "collection/meta/runtime.yml",
    "collection/plugins/module_utils/names.py",
    "operator/charts/metax-gpu-extensions/Chart.yaml", "operator/charts/metax-gpu-extensions/templates/a.yaml",
    "operator/crds/clusteroperator.yaml",
}


def _tree(directory):
    return {os.path.relpath(os.path.join(d, f), directory) for d, _dirs, files in os.walk(directory) for f in files}


def test_installed_collection_context(tmp_path):
    """No git: every file under the collection paths but bytecode."""
    root = tmp_path / "ansible_collections" / "metax" / "gpu"
    helm = _fake_collection(str(root), str(tmp_path))
    entries = context.manifest(str(root), context.find_helm(helm))
    assert {dest for dest, _src in entries} == EXPECTED
    out = tmp_path / "ctx"
    subprocess.run([sys.executable, SCRIPT, "--root", str(root), "assemble", "--helm", helm, str(out)], check=True)
    assert _tree(str(out)) == EXPECTED
    for dest, src in entries:
        with open(os.path.join(str(out), dest), "rb") as copied, open(src, "rb") as original:
            assert copied.read() == original.read(), dest
    assert os.access(str(out / "entrypoint"), os.X_OK) and os.access(str(out / "operator" / "bin" / "helm"), os.X_OK)


@pytest.mark.skipif(not shutil.which("git"), reason="git is not installed")
def test_checkout_context_follows_git(tmp_path):
    """A checkout: tracked and untracked work, never what .gitignore excludes."""
    root = tmp_path / "repo"
    helm = _fake_collection(str(root), str(tmp_path))
    (root / ".gitignore").write_text("__pycache__/\n*.pyc\nplugins/module_utils/local.txt\n")
    (root / "plugins" / "module_utils" / "local.txt").write_text("ignored\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "galaxy.yml", "meta"], check=True)
    dests = {dest for dest, _src in context.manifest(str(root), context.find_helm(helm))}
    assert dests == EXPECTED


def test_content_tag_follows_every_input(tmp_path):
    root = tmp_path / "c"
    helm = _fake_collection(str(root), str(tmp_path))

    def tag(base="sha256:1"):
        out = _run([sys.executable, SCRIPT, "--root", str(root), "tag", "--helm", helm, "--base-id", base]).strip()
        assert re.fullmatch(r"[0-9a-f]{12}", out), out
        return out

    first = tag()
    assert tag() == first                                   # stable
    assert tag("sha256:2") != first                         # the base image
    names = root / "plugins" / "module_utils" / "names.py"
    names.write_text("X = 2\n")
    edited = tag()
    assert edited != first                                  # a collection file
    (root / "plugins" / "module_utils" / "__pycache__" / "names.cpython-311.pyc").write_text("other")
    assert tag() == edited                                  # bytecode is not content
    os.chmod(str(names), 0o755)
    assert tag() != edited                                  # a file mode
    os.chmod(str(names), 0o644)
    (root / "files" / "charts" / "metax-gpu-extensions" / "templates" / "a.yaml").write_text("a: 2\n")
    assert tag() != edited                                  # the chart operator-controller renders


def test_missing_helm_is_a_clear_error(tmp_path):
    root = tmp_path / "c"
    _fake_collection(str(root), str(tmp_path))
    res = subprocess.run([sys.executable, SCRIPT, "--root", str(root), "tag", "--helm", str(tmp_path / "no-helm")],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 1 and "no-helm is missing" in res.stderr and not res.stdout


def test_the_galaxy_artifact_carries_context_py():
    """The installed role runs it: galaxy.yml's build_ignore must not drop it."""
    with open(os.path.join(ROOT, "galaxy.yml")) as handle:
        ignored = yaml.safe_load(handle)["build_ignore"]
    for rel in ("files/images/agent/context.py", "files/images/agent/Containerfile", "files/images/agent/entrypoint"):
        for part in [rel] + [os.path.basename(rel)] + rel.split("/")[:-1]:
            assert not any(fnmatch.fnmatch(part, pattern) for pattern in ignored), (rel, part)


def test_build_sh_print_is_the_name_ref_lines_the_integration_tests_read(tmp_path):
    """build.sh --print: one NAME=REF line per image of context.py, tagged with context.py's hash.

    The container engine is the one stand-in (a podman that has the base image, with a fixed ID);
    the names, the context and the tag are build.sh's and context.py's own.
    """
    cache = tmp_path / "cache"
    env = dict(os.environ, METAX_CACHE_DIR=str(cache), METAX_REGISTRY="127.0.0.1:5000")
    env.pop("METAX_AGENT_REPO_PREFIX", None)
    lib = os.path.join(ROOT, "scripts", "cluster", "lib.sh")
    helm_dir = subprocess.run(["bash", "-c", 'source "$1" && helm_bin_dir', "-", lib], env=env, capture_output=True,
                              text=True, check=True).stdout.strip()
    os.makedirs(helm_dir)
    helm = os.path.join(helm_dir, "helm")
    with open(helm, "w") as handle:
        handle.write("#!/bin/sh\necho fake helm\n")
    os.chmod(helm, 0o755)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "podman").write_text('#!/bin/sh\ncase "$1 $2" in\n  "image exists") exit 0 ;;\n'
                                 '  "image inspect") echo sha256:0123 ;;\n  *) exit 3 ;;\nesac\n')
    os.chmod(str(fake / "podman"), 0o755)
    env["PATH"] = "%s:%s" % (fake, env["PATH"])
    res = subprocess.run([BUILD_SH, "--print"], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    tag = _run([sys.executable, SCRIPT, "--root", ROOT, "tag", "--helm", helm, "--base-id", "sha256:0123"]).strip()
    assert res.stdout.splitlines() == ["%s=127.0.0.1:5000/metax-gpu/%s:%s" % (name, name, tag) for name in context.IMAGES]
    # what tests/integration's agent_images fixtures do with it
    refs = dict(line.split("=", 1) for line in res.stdout.split() if "=" in line)
    assert list(refs) == list(context.IMAGES)
