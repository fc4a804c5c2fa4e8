"""docs/vfio.md's KubeVirt section is what scripts/gen_vfio_doc.py makes of names.py and the GPU model."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil

from ansible_collections.metax.gpu.plugins.module_utils import names
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.vfio import kubevirt_env_var
from ansible_collections.metax.gpu.plugins.module_utils.gpu.model import METAX_VENDOR_ID, PCI_DEVICE_IDS

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _script():
    spec = importlib.util.spec_from_file_location("gen_vfio_doc", os.path.join(ROOT, "scripts", "gen_vfio_doc.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_doc_is_up_to_date():
    assert _script().out_of_date(ROOT) == [], "run python3 scripts/gen_vfio_doc.py"


def test_the_entry_names_every_metax_device_id_and_the_resource():
    with open(os.path.join(ROOT, "docs", "vfio.md")) as handle:
        text = handle.read()
    selectors = re.findall(r'pciVendorSelector: "([0-9a-f]{4}):([0-9a-f]{4})"', text)
    assert sorted(int(d, 16) for _v, d in selectors) == sorted(PCI_DEVICE_IDS)
    assert {int(v, 16) for v, _d in selectors} == {METAX_VENDOR_ID}
    assert text.count("resourceName: %s" % names.VFIO_RESOURCE_NAME) == len(PCI_DEVICE_IDS)
    assert text.count("externalResourceProvider: true") == len(PCI_DEVICE_IDS)
    # the generator and the device plugin spell KubeVirt's variable alike
    assert _script().kubevirt_env_var(names.VFIO_RESOURCE_NAME) == kubevirt_env_var()
    assert kubevirt_env_var() in text


def test_a_stale_section_is_found_and_rewritten(tmp_path):
    for rel in ("docs/vfio.md", "plugins/module_utils/names.py", "plugins/module_utils/gpu/model.py"):
        os.makedirs(os.path.dirname(str(tmp_path / rel)), exist_ok=True)
        shutil.copy(os.path.join(ROOT, rel), str(tmp_path / rel))
    names_py = tmp_path / "plugins/module_utils/names.py"
    names_py.write_text(names_py.read_text().replace('PREFIX + "vfio-gpu"', 'PREFIX + "vm-gpu"'))
    script = _script()
    assert script.out_of_date(str(tmp_path)) == ["docs/vfio.md"]
    script.write(str(tmp_path))
    assert script.out_of_date(str(tmp_path)) == []
    assert "resourceName: metax-tech.com/vm-gpu" in (tmp_path / "docs/vfio.md").read_text()
