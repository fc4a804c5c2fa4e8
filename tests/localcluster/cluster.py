# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The whole cluster's generated files, from its settings, node plan and inputs (pure)."""

from __future__ import annotations

from typing import Sequence

from . import nodes as nodes_mod
from .component import FileSpec, Files, Inputs
from .node import NodeComponent
from .pki import PkiComponent
from .registries import RegistriesComponent
from .nodes import Node
from .scheduler import SchedulerComponent
from .settings import Settings

__all__ = ["SchedulerComponent", "components", "generated_files"]


def components(settings: Settings, nodes: Sequence[Node], inputs: Inputs,
               containerd_config_version: int = 3) -> list[Files]:
    """In the order `up` makes them."""
    out: list[Files] = [PkiComponent(settings, tuple(nodes), inputs), RegistriesComponent(settings, inputs),
                        SchedulerComponent(settings)]
    out += [NodeComponent(settings, n, inputs, containerd_config_version) for n in nodes]
    return out


def generated_files(settings: Settings, nodes: Sequence[Node], inputs: Inputs) -> list[FileSpec]:
    files: list[FileSpec] = [FileSpec(settings.state_dir + "/node-table", nodes_mod.render_table(nodes)),
                             FileSpec(settings.state_dir + "/node-name", nodes[0].name + "\n")]
    for c in components(settings, nodes, inputs):
        files += c.files()
    return files
