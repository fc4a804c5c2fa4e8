# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Errors of the registry client and the artifact readers."""

from __future__ import annotations

from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError


class RegistryError(MetaxGpuError):
    """The registry refused or failed a request."""


class AuthError(RegistryError):
    """Wrong or missing credentials."""


class TransientError(RegistryError):
    """A failure worth retrying (connection cut, 5xx, cancelled upload session)."""


class ArtifactError(MetaxGpuError, ValueError):
    """A source archive, layout or chart is missing or corrupt."""


class StreamRefused(RegistryError):
    """The registry (or a proxy before it) refuses a chunked upload: send the blob with a known length."""
