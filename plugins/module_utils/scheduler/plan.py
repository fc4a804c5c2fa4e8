# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""current -> desired for the two files: the static pod manifest and the extender configuration.

The manifest is the truth about what the scheduler runs with; the header of
our configuration file remembers the ``--config`` we replaced. Reading other
files (the configuration the scheduler already used) goes through an injected
``read(path) -> text or None``, so this stays free of I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

from ansible_collections.metax.gpu.plugins.module_utils.scheduler import config as cfg
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import manifest as mf
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import yamlsupport

Reader = Callable[[str], Optional[str]]


@dataclass(frozen=True)
class Desired:
    manifest: str
    config: Optional[str]               # None: the configuration file should not exist
    version: Optional[Tuple[int, int]]
    previous_arg: Optional[str]         # the --config we replace (enabled) or put back (disabled)
    drift: bool                         # enabled before (our file exists) but the manifest lost the patch


def _path_of(arg: str) -> str:
    """``--config=/x`` or ``"--config=/x"`` (as written in the manifest) -> ``/x``."""
    value = yamlsupport.yaml.safe_load(arg)
    if not isinstance(value, str) or not value.startswith(mf.CONFIG_FLAG):
        raise cfg.SchedulerConfigError("cannot read the previous --config argument %r" % arg)
    return value[len(mf.CONFIG_FLAG):]


def enabled(manifest_text: str, config_text: Optional[str], config_path: str, options: cfg.ExtenderOptions,
            read: Reader, kubernetes_version: Optional[str] = None) -> Desired:
    info = mf.inspect(manifest_text)
    version = cfg.parse_version(kubernetes_version or info.image)
    cfg.api_version_for(version)            # refuse < 1.23 before anything else
    ours, header_prev = cfg.previous_arg_of(config_text) if config_text is not None else (False, None)
    base_text: Optional[str] = None
    base_where = ""
    if info.config_path == config_path:
        previous = header_prev
        if previous is not None:
            base_where = _path_of(previous)
            base_text = read(base_where)
            if base_text is None:
                raise cfg.SchedulerConfigError(
                    "the scheduler configuration %s that %s was merged from is gone; restore it or "
                    "disable and enable again" % (base_where, config_path))
        elif not ours and config_text is not None:
            # Enabled by hand as the manual does: adopt that file, keep what it holds.
            base_where, base_text = config_path, config_text
    elif info.config_path is not None:
        previous = info.config_arg
        base_where = info.config_path
        base_text = read(base_where)
        if base_text is None:
            raise cfg.SchedulerConfigError(
                "the scheduler runs with --config=%s but that file cannot be read" % base_where)
    else:
        previous = None
    base = cfg.parse_config(base_text, base_where) if base_text is not None else None
    merged = cfg.merge(base, cfg.build_extender(options), version,
                       kubeconfig=info.kubeconfig or cfg.DEFAULT_KUBECONFIG)
    new_manifest, _replaced = mf.patch(manifest_text, config_path)
    drift = config_text is not None and ours and not info.patched(config_path)
    return Desired(manifest=new_manifest, config=cfg.render(merged, previous), version=version,
                   previous_arg=previous, drift=drift)


def disabled(manifest_text: str, config_text: Optional[str], config_path: str) -> Desired:
    info = mf.inspect(manifest_text)
    previous: Optional[str] = None
    if info.config_path == config_path and config_text is not None:
        previous = cfg.previous_arg_of(config_text)[1]
    return Desired(manifest=mf.unpatch(manifest_text, config_path, previous), config=None, version=None,
                   previous_arg=previous, drift=False)
