# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""OCI distribution client, artifact readers and the offline image bundle (controller side).

Nothing here imports ``ansible.*``: the bundle carries this package as its
standalone pusher (``metax-k8s-images.<ver>.run push``).
"""
