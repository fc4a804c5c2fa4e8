# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Two cluster streams share the modules either cluster may run: each module goes to the first to claim it.

The first stream runs every cluster module and takes the shared ones last, front to back; the second
starts late and takes them from the back. Wherever the two meet, each module ran once, and neither
stream waits while the other still has modules to give. A claim is a directory made with mkdir, which
either succeeds or finds it made: atomic between the machine's pytest and the sandbox's, which share
the checkout.
"""

from __future__ import annotations

import os
from typing import Callable, Iterator, List, Optional, Sequence


class ModuleClaims:
    """The claims of one run, in DIRECTORY (made afresh by run-tests.sh)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def claim(self, module: str) -> bool:
        """True when this session now owns MODULE; False when the other stream does."""
        try:
            os.mkdir(os.path.join(self.directory, module))
        except FileExistsError:
            return False
        return True


def module_groups(items: Sequence, module_of: Callable[[object], str]) -> List[list]:
    """ITEMS cut into runs of one module each (collection keeps a module's tests together)."""
    groups: List[list] = []
    for item in items:
        if groups and module_of(groups[-1][0]) == module_of(item):
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def claimed_run(groups: Sequence[list], module_of: Callable[[object], str], shared: Sequence[str],
                claim: Callable[[str], bool]) -> Iterator[tuple]:
    """(item, nextitem) for each test this session runs, in order.

    A shared module runs only once claimed, and it is claimed as the last test before it starts, not
    earlier: a stream holds no module it has not nearly reached. ``nextitem`` is the next test that
    will run (pytest needs it when that last test starts), so a module's fixtures are torn down after
    its last test that ran.
    """
    pending = iter(groups)

    def next_group() -> Optional[list]:
        for group in pending:
            name = module_of(group[0])
            if name not in shared or claim(name):
                return group
        return None

    current = next_group()
    while current is not None:
        following: Optional[list] = None
        for index, item in enumerate(current):
            last = index == len(current) - 1
            if last:
                following = next_group()
            nextitem = current[index + 1] if not last else (following[0] if following else None)
            yield item, nextitem
        current = following
