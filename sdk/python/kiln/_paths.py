"""Where kilnd's socket is: the same resolution as the ``kiln`` CLI."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

__all__ = ["resolve_socket", "user_socket", "SYSTEM_SOCKET"]

#: The system service's socket.
SYSTEM_SOCKET = "/run/kiln/kiln.sock"

PathLike = Union[str, "os.PathLike[str]"]


def _env(name: str) -> Optional[str]:
    value = os.environ.get(name)
    return value if value else None


def _user_runtime_dir() -> Path:
    """``$XDG_RUNTIME_DIR``, else ``/run/user/UID`` when it exists, else ``$TMPDIR/kiln-UID``."""
    xdg = _env("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg)
    uid = os.getuid()
    run_user = Path(f"/run/user/{uid}")
    if run_user.is_dir():
        return run_user
    return Path(_env("TMPDIR") or "/tmp") / f"kiln-{uid}"


def user_socket() -> str:
    """The socket of a user-mode kilnd: ``<runtime dir>/kiln/kiln.sock``."""
    return str(_user_runtime_dir() / "kiln" / "kiln.sock")


def resolve_socket(explicit: Optional[PathLike] = None) -> str:
    """The socket a client should use.

    In order: ``explicit``; ``$KILN_SOCKET``; the user socket if it exists; the system
    socket (``/run/kiln/kiln.sock``) if it exists; else the user socket (so that the
    "not running" error names where a user-mode kilnd would listen).
    """
    if explicit is not None and str(explicit):
        return os.fspath(explicit)
    env = _env("KILN_SOCKET")
    if env:
        return env
    user = user_socket()
    if os.path.exists(user):
        return user
    if os.path.exists(SYSTEM_SOCKET):
        return SYSTEM_SOCKET
    return user
