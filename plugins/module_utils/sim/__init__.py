# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The simulated MetaX node: a host root generator plus fault injection."""
