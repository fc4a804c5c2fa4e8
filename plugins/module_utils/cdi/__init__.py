# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""CDI (Container Device Interface) for MetaX GPUs: the spec, and keeping it current on a node."""
