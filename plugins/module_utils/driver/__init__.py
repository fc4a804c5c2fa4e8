# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The MetaX kernel driver on a node (no Ansible import; see backend.py)."""
