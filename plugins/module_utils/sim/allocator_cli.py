# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The allocator's command line over a simulator preset (JSON on stdout)::

    python -m ansible_collections.metax.gpu.plugins.module_utils.sim.allocator_cli \\
        --preset 8xC500 [--vfs 4] [--exclude 0,1] [--must-include 2] (--size N | --tables)

``gpu.allocator_cli`` with the simulator's presets passed in (``--host-root``
works here too): the simulator imports the library, never the reverse.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..gpu import allocator_cli
from ..gpu.model import Topology
from .alloc_synth import topology_from_spec
from .spec import preset


def preset_topology(name: str, vfs: int) -> Topology:
    """The topology of simulator preset ``name`` with ``vfs`` VFs per GPU."""
    return topology_from_spec(preset(name), vfs)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return allocator_cli.main(argv, presets=preset_topology,
                              prog="python -m ansible_collections.metax.gpu.plugins.module_utils.sim.allocator_cli")


if __name__ == "__main__":
    raise SystemExit(main())
