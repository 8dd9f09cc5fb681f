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


def _given(args: list[str], name: str) -> bool:
    """Whether ``args`` give the flag ``name`` (``name`` or ``name=VALUE``)."""
    return any(a == name or a.startswith(name + "=") for a in args)


def _flag(args: list[str], name: str) -> str | None:
    """The value of ``name VALUE`` or ``name=VALUE`` in ``args`` (the last one given), else None."""
    value = None
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value


def start_tokenizer_early(argv: list[str] | None = None) -> None:
    """A ``generate`` or ``chat`` command that will load its model in this process (no keep-alive, no
    ``--tp``): start the helper that parses its checkpoint's tokenizer.json now, before ``import shapeplan``
    imports torch (1.5-4 s on the lent GPU machines), so that the parse is over when the pipeline asks for it
    (shapeplan/_tokproc.py; ``SHAPEPLAN_TOKENIZER_PROCESS`` decides). Best effort: the command starts it
    otherwise (a second start for the same checkpoint is nothing), and a helper nobody takes ends at exit."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("generate", "chat") or light_command(args) or _given(args, "--tp"):
        return
    model = _flag(args, "--model")
    if model:
        from shapeplan import _tokproc
        try:
            _tokproc.start_for_command(model)
        except SwitchError:                    # a bad SHAPEPLAN_TOKENIZER_PROCESS: the command's own start says so
            pass


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
    if args[0] != "generate" or _given(args, "--tp"):
        return False
    flag = _flag(args, "--keep-alive")
    try:
        return (env.get("SHAPEPLAN_KEEP_ALIVE") if flag is None else env.duration(flag)) > 0
    except (ValueError, SwitchError):          # the command's own parse reports it
        return False
