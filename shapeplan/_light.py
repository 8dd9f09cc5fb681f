"""Whether a ``shapeplan`` command's process needs the standard library only, so that ``import shapeplan``
skips its eager imports (torch among them) there: ``shapeplan ps`` / ``stop``, ``generate`` as the client of a
keep-alive server (shapeplan/commands/_keepalive.py), whose whole run is a socket and a few JSON lines, and
that server itself until it has bound its socket (it imports the engine after)."""
from __future__ import annotations

import sys

from shapeplan import env
from shapeplan.errors import SwitchError

#: the light commands (with ``generate``: when it has a keep-alive) and the command module that registers each
MODULES = {"generate": "generate", "ps": "ps", "stop": "ps"}
#: the hidden command of a keep-alive server's process (``python -m shapeplan _keepalive-server SPEC``)
SERVER_COMMAND = "_keepalive-server"


def light_command(argv: list[str] | None = None) -> bool:
    """Whether this process's command needs the standard library only: ``ps``, ``stop``, or ``generate``
    with a keep-alive (its ``--keep-alive`` or ``SHAPEPLAN_KEEP_ALIVE``) and no ``--tp``. ``shapeplan/__init__``
    asks it before its eager imports (torch); a wrong guess only costs time, as the names still import
    on first use."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        return False
    if (args[0] in MODULES and args[0] != "generate") or args[0] == SERVER_COMMAND:  # (a server: binds first)
        return True
    if args[0] != "generate" or any(a == "--tp" or a.startswith("--tp=") for a in args):
        return False
    flag = None
    for i, a in enumerate(args):
        if a == "--keep-alive" and i + 1 < len(args):
            flag = args[i + 1]
        elif a.startswith("--keep-alive="):
            flag = a.split("=", 1)[1]
    try:
        return (env.get("SHAPEPLAN_KEEP_ALIVE") if flag is None else env.duration(flag)) > 0
    except (ValueError, SwitchError):          # the command's own parse reports it
        return False
