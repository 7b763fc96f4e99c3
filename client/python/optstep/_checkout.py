"""The source checkout this package runs from, when it does (an editable install of
client/python, as bazel/python_env.sh makes). Not API: an installed wheel has no checkout, and
LocalServer then needs a binary argument or $OPTSTEP_SERVER.
"""

from __future__ import annotations

import pathlib
from typing import Optional


def checkout_root() -> Optional[pathlib.Path]:
    """The repository that holds this package's client/python/optstep/, or None."""
    root = pathlib.Path(__file__).resolve().parents[3]
    if (root / "WORKSPACE").is_file() and (root / "client" / "python" / "optstep").is_dir():
        return root
    return None


def checkout_server_binary() -> Optional[pathlib.Path]:
    """bazel-bin/server/optstep_server of the checkout (built or not), or None without one."""
    root = checkout_root()
    return None if root is None else root / "bazel-bin" / "server" / "optstep_server"
