# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Names at the registry's boundary: repositories, tags, digests and registry addresses.

Everything a source archive, a bundle header or a module option says about
where an artifact goes is checked here against the OCI distribution grammar
(distribution-spec "Pulling manifests", and distribution/reference) before it
becomes a URL path or a file path. A name the grammar refuses never reaches
the registry or the disk: ``cloud/../library/busybox`` would otherwise be
normalised by the HTTP layer to ``library/busybox``, another project, and a
digest ``sha256:../../x`` would name a file outside an OCI layout.

Standard library only, Python 3.8: the offline bundle's pusher carries it.
"""

from __future__ import annotations

import re
from typing import Tuple

from ansible_collections.metax.gpu.plugins.module_utils.registry.errors import ArtifactError

# distribution/reference: path-component = alpha-numeric (separator alpha-numeric)*
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(r"\A%s(?:/%s)*\Z" % (_COMPONENT, _COMPONENT))
_TAG = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9._-]{0,127}\Z")
# digest = algorithm ":" encoded; algorithm = component (separator component)*
_DIGEST = re.compile(r"\A[a-z0-9]+(?:[+._-][a-z0-9]+)*:[a-zA-Z0-9=_-]+\Z")
# the registered algorithms: lowercase hex of a fixed length (OCI image-spec descriptor.md)
_ENCODED_LENGTH = {"sha256": 64, "sha512": 128}
_HEX = re.compile(r"\A[a-f0-9]+\Z")
_DOMAIN = re.compile(r"\A(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
                     r"(?:\.(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9]))*\Z")
_IPV6 = re.compile(r"\A\[[0-9A-Fa-f:.]+\]\Z")
_VERSION = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._+-]{0,127}\Z")
MAX_REPOSITORY = 255    # distribution's NameTotalLengthMax


class InvalidReference(ArtifactError):
    """A repository, tag, digest or registry address outside the OCI distribution grammar."""


def repository(name: str, what: str = "repository") -> str:
    """``name`` if it is a valid repository path (lowercase components, no ``..``, no leading ``/``)."""
    if not isinstance(name, str) or not _REPOSITORY.match(name) or len(name) > MAX_REPOSITORY:
        raise InvalidReference(
            "%s %r is not a valid repository name: lowercase letters, digits and single '.', '_', '__' or "
            "'-' separators in '/'-separated components (OCI distribution grammar; no '..', no empty component)"
            % (what, name))
    return name


def tag(value: str, what: str = "tag") -> str:
    if not isinstance(value, str) or not _TAG.match(value):
        raise InvalidReference("%s %r is not a valid tag: [A-Za-z0-9_][A-Za-z0-9._-]{0,127} (OCI distribution grammar)"
                               % (what, value))
    return value


def digest(value: str, what: str = "digest") -> str:
    """``value`` if it is ``algorithm:encoded`` (lowercase hex of the right length for sha256/sha512)."""
    if not isinstance(value, str) or not _DIGEST.match(value):
        raise InvalidReference("%s %r is not a valid digest (algorithm:encoded, OCI digest grammar)" % (what, value))
    algorithm, _sep, encoded = value.partition(":")
    length = _ENCODED_LENGTH.get(algorithm)
    if length is None or len(encoded) != length or not _HEX.match(encoded):
        raise InvalidReference("%s %r is not a valid digest: expected sha256:<64 hex> or sha512:<128 hex>" % (what, value))
    return value


def reference(value: str, what: str = "reference") -> str:
    """A manifest reference: a tag or a digest."""
    return digest(value, what) if ":" in value else tag(value, what)


def image_reference(value: str, what: str = "image reference") -> Tuple[str, str, str]:
    """``[DOMAIN[:port]/]PATH[:TAG]`` (a RepoTags entry, an image name annotation) -> (domain, path, tag),
    each part checked; the tag defaults to ``latest``. A digest suffix (``@sha256:...``) is not taken."""
    if not isinstance(value, str) or not value:
        raise InvalidReference("%s %r is empty or not a string" % (what, value))
    rest, tag_value = value, "latest"
    last_slash = value.rfind("/")
    colon = value.rfind(":")
    if colon > last_slash:
        rest, tag_value = value[:colon], value[colon + 1:]
    domain, sep, path = rest.partition("/")
    if not sep or not ("." in domain or ":" in domain or domain == "localhost" or domain.startswith("[")):
        domain, path = "", rest
    if domain:
        host(domain, what)
    repository(path, what)
    tag(tag_value, what)
    return domain, path, tag_value


def version(value: str, what: str = "version") -> str:
    """A release version as it goes into file names and the bundle's shell header (no quoting needed)."""
    if not isinstance(value, str) or not _VERSION.match(value):
        raise InvalidReference("%s %r is not a valid version: letters, digits and '.', '_', '+', '-', "
                               "starting with a letter or digit" % (what, value))
    return value


def host(value: str, what: str = "registry") -> str:
    """``DOMAIN[:port]`` or ``[IPv6][:port]``, port 1-65535."""
    name, port = value, ""
    if value.startswith("["):
        end = value.find("]")
        name, rest = value[:end + 1], value[end + 1:]
        if end < 0 or (rest and not rest.startswith(":")):
            raise InvalidReference("%s %r: not DOMAIN[:port] or [IPv6][:port]" % (what, value))
        port = rest[1:] if rest else ""
        ok = bool(_IPV6.match(name))
    else:
        name, sep, port = value.partition(":")
        if sep and not port:
            port = "x"  # 'host:' has an empty port
        ok = bool(_DOMAIN.match(name))
    if not ok:
        raise InvalidReference("%s %r: %r is not a host name (DOMAIN[:port], no spaces, no scheme)" % (what, value, name))
    if port and (not port.isdigit() or not 1 <= int(port) <= 65535):
        raise InvalidReference("%s %r: the port must be 1-65535" % (what, value))
    return value


def registry(value: str, what: str = "registry") -> Tuple[str, str]:
    """``DOMAIN[:port][/PROJECT]`` -> (host, project), both validated; the project may be empty."""
    if not isinstance(value, str):
        raise InvalidReference("%s %r: expected DOMAIN[:port][/PROJECT]" % (what, value))
    text = value.strip().rstrip("/")
    if "://" in text:
        raise InvalidReference("%s %r: give DOMAIN[:port][/PROJECT] without a scheme (plain_http selects http)"
                               % (what, value))
    name, _sep, project = text.partition("/")
    if not name:
        raise InvalidReference("%s %r: expected DOMAIN[:port][/PROJECT]" % (what, value))
    host(name, what)
    if project:
        repository(project, "%s project" % what)
    return name, project
