# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""``podTemplateSpec`` overrides: global, then per component, over the rendered pod template.

The rule (MetaX's documentation of minimal mode): the component's override
beats the global one; maps merge; lists append. One refinement keeps a merge
from producing an invalid pod: list items that carry a ``name`` (containers,
env, volumes, volumeMounts, ports) and whose name is already in the list merge
into that item instead of being appended a second time.
"""

from __future__ import annotations

import copy
from typing import Any, List, Mapping, Optional


def merge(base: Any, override: Any) -> Any:
    """``override`` merged over ``base`` (neither is modified): maps merge, lists append, scalars replace."""
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        out = {k: copy.deepcopy(v) for k, v in base.items()}
        for key, value in override.items():
            out[key] = merge(out[key], value) if key in out else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(override, list):
        return _merge_lists(base, override)
    return copy.deepcopy(override)


def _merge_lists(base: List[Any], override: List[Any]) -> List[Any]:
    out = [copy.deepcopy(item) for item in base]
    for item in override:
        name = item.get("name") if isinstance(item, Mapping) else None
        index = next((i for i, old in enumerate(out)
                      if name is not None and isinstance(old, Mapping) and old.get("name") == name), None)
        if index is None:
            out.append(copy.deepcopy(item))
        else:
            out[index] = merge(out[index], item)
    return out


def apply_overrides(template: Mapping[str, Any], global_override: Optional[Mapping[str, Any]],
                    component_override: Optional[Mapping[str, Any]]) -> Any:
    """The pod template after the global, then the component's ``podTemplateSpec``."""
    result: Any = copy.deepcopy(dict(template))
    for override in (global_override, component_override):
        if override:
            result = merge(result, override)
    return result
