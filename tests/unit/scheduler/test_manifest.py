"""Static pod manifest edits: what is added, byte-for-byte removal, idempotence, refusals."""
from __future__ import annotations

import string

import pytest
import yaml
from hypothesis import given, strategies as st

from ansible_collections.metax.gpu.plugins.module_utils.scheduler import manifest as mf

from scheduler_support import CONFIG_PATH, EXISTING_CONFIG_PATH, VERSIONS, manifest

ALL = VERSIONS + ("1.28-config",)


def _container(text):
    return yaml.safe_load(text)["spec"]["containers"][0]


@pytest.mark.parametrize("name", ALL)
def test_patch_adds_config_mount_and_volume(name):
    original = manifest(name)
    new, previous = mf.patch(original, CONFIG_PATH)
    pod, before = yaml.safe_load(new), yaml.safe_load(original)
    container = pod["spec"]["containers"][0]
    assert "--config=" + CONFIG_PATH in container["command"]
    assert {"mountPath": CONFIG_PATH, "name": "extenderconfig", "readOnly": True} in container["volumeMounts"]
    assert {"hostPath": {"path": CONFIG_PATH, "type": "File"}, "name": "extenderconfig"} in pod["spec"]["volumes"]
    # nothing else changed: same pod once our three additions are taken out
    container["command"] = [c for c in container["command"] if c != "--config=" + CONFIG_PATH]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["mountPath"] != CONFIG_PATH]
    pod["spec"]["volumes"] = [v for v in pod["spec"]["volumes"] if v["hostPath"]["path"] != CONFIG_PATH]
    bc = before["spec"]["containers"][0]
    bc["command"] = [c for c in bc["command"] if not c.startswith("--config=")]
    assert pod == before
    if name == "1.28-config":
        assert previous == '"--config=%s"' % EXISTING_CONFIG_PATH
        assert "# tuned scheduling profile (ops ticket 4711)\n" in new      # comments survive
    else:
        assert previous is None


@pytest.mark.parametrize("name", ALL)
def test_patch_is_idempotent_and_unpatch_restores_bytes(name):
    original = manifest(name)
    new, previous = mf.patch(original, CONFIG_PATH)
    assert new != original
    assert mf.patch(new, CONFIG_PATH) == (new, None)
    assert mf.inspect(new).patched(CONFIG_PATH)
    assert not mf.inspect(original).patched(CONFIG_PATH)
    back = mf.unpatch(new, CONFIG_PATH, previous)
    assert back == original
    assert mf.unpatch(back, CONFIG_PATH, previous) == original    # disable twice: no change


def test_unpatch_leaves_someone_elses_config_alone():
    original = manifest("1.28-config")
    assert mf.unpatch(original, CONFIG_PATH) == original


def test_crlf_manifest_keeps_its_line_ends():
    original = manifest("1.28").replace("\n", "\r\n")
    new, previous = mf.patch(original, CONFIG_PATH)
    assert "\n" not in new.replace("\r\n", "")
    assert mf.unpatch(new, CONFIG_PATH, previous) == original


@pytest.mark.parametrize("name,probe", [
    ("1.23", mf.Probe("https", "127.0.0.1", 10259, "/healthz")),
    ("1.28", mf.Probe("https", "127.0.0.1", 10259, "/healthz")),
    ("1.32", mf.Probe("https", "127.0.0.1", 10259, "/readyz")),
])
def test_inspect_finds_the_health_endpoint(name, probe):
    info = mf.inspect(manifest(name))
    assert info.probe == probe
    assert info.kubeconfig == "/etc/kubernetes/scheduler.conf"
    assert info.image.endswith("v" + name + (".17" if name == "1.23" else ".15" if name == "1.28" else ".3"))


_PATH_CHARS = string.ascii_letters + string.digits + "-_."


@given(dirs=st.lists(st.text(_PATH_CHARS, min_size=1, max_size=12), min_size=1, max_size=4),
       name=st.sampled_from(ALL), spaces=st.booleans())
def test_property_round_trip_any_config_path(dirs, name, spaces):
    path = "/" + "/".join(dirs) + (" x.yaml" if spaces else ".yaml")
    original = manifest(name)
    new, previous = mf.patch(original, path)
    assert yaml.safe_load(new)["spec"]["volumes"][-1]["hostPath"]["path"] == path
    assert mf.patch(new, path)[0] == new
    assert mf.unpatch(new, path, previous) == original


@pytest.mark.parametrize("mutate,message", [
    (lambda t: t + "  foo: [\n", "not valid YAML"),
    (lambda t: t + "---\nkind: Pod\n", "2 YAML documents"),
    (lambda t: t.replace("kind: Pod", "kind: Deployment"), "not a Pod"),
    (lambda t: t.replace("    volumeMounts:\n    - mountPath: /etc/kubernetes/scheduler.conf\n"
                         "      name: kubeconfig\n      readOnly: true\n", ""), "no volumeMounts"),
    (lambda t: t.replace("  - command:\n    - kube-scheduler\n", "  - command: [kube-scheduler,\n"
                         "    --bind-address=127.0.0.1]\n    args:\n    - kube-scheduler\n")
     .replace("    - --authentication", "    - --authentication", 1), None),
    (lambda t: t.replace("    - --leader-elect=true\n", "    - --leader-elect=true\n    - --config\n    - /x.yaml\n"),
     "two list items"),
    (lambda t: t.replace("  volumes:\n  - hostPath:", "  volumes:\n  -   hostPath:"), None),
])
def test_malformed_manifests_refused_clearly(mutate, message):
    text = mutate(manifest("1.28"))
    if message is None:
        # unusual but still safe layouts: either edited correctly or refused, never corrupted
        try:
            new, previous = mf.patch(text, CONFIG_PATH)
        except mf.ManifestError:
            return
        assert mf.unpatch(new, CONFIG_PATH, previous) == text
        return
    with pytest.raises(mf.ManifestError, match=message):
        mf.patch(text, CONFIG_PATH)


def test_volume_name_clash_refused():
    text = manifest("1.28").replace("    name: kubeconfig\nstatus", "    name: extenderconfig\nstatus")
    with pytest.raises(mf.ManifestError, match="already has a volume named"):
        mf.patch(text, CONFIG_PATH)


def test_manual_patch_is_recognised():
    """A manifest patched by hand as the manual's step 3 shows is already patched."""
    new, _previous = mf.patch(manifest("1.23"), CONFIG_PATH)
    assert mf.inspect(new).config_path == CONFIG_PATH
    assert mf.patch(new, CONFIG_PATH)[0] == new
