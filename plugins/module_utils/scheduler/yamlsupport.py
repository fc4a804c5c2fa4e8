# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The one guarded PyYAML import of the scheduler package.

PyYAML is a dependency of ansible-core, so it is on every controller; a
control-plane node that lacks it gets ``missing_required_lib('PyYAML')`` from
the module instead of a traceback (docs/design-decisions.md).
"""

from __future__ import annotations

import traceback

try:
    import yaml
    HAS_YAML = True
    YAML_IMPORT_ERROR = None
except ImportError:  # pragma: no cover - ansible-core depends on PyYAML
    yaml = None
    HAS_YAML = False
    YAML_IMPORT_ERROR = traceback.format_exc()


def safe_dump(data: object) -> str:
    """Block-style YAML in the order the caller built it (the scheduler ignores order; readers do not)."""
    return yaml.safe_dump(data, default_flow_style=False, sort_keys=False)
