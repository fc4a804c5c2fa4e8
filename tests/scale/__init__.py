# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The scale profile (issue 29): kwok + fake GPU nodes carrying our agents' real output."""
