"""``python -m torch_rbln.explain [--with-stack] [--json PATH] SCRIPT [ARGS...]`` (or ``-m MODULE``):
run a program as ``python`` would -- the same ``sys.argv``, run as ``__main__``, its exit status
-- and print the explain report of the whole run when it ends (``whole_run.py``)."""

from __future__ import annotations

import os
import runpy
import sys
import traceback

USAGE = ("usage: python -m torch_rbln.explain [--with-stack] [--json PATH] "
         "(SCRIPT | -m MODULE) [ARGS...]")


def _parse(argv: list[str]):
    with_stack, json_path = False, None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--with-stack":
            with_stack = True
        elif a == "--json" and i + 1 < len(argv):
            i += 1
            json_path = argv[i]
        elif a.startswith("--json="):
            json_path = a.split("=", 1)[1]
        elif a in ("-h", "--help"):
            print(USAGE)
            sys.exit(0)
        elif a == "-m" and i + 1 < len(argv):
            return with_stack, json_path, argv[i + 1], True, argv[i + 2:]
        elif a.startswith("-"):
            sys.exit(f"{USAGE}\nunknown option {a}")
        else:
            return with_stack, json_path, a, False, argv[i + 1:]
        i += 1
    sys.exit(USAGE)


def main(argv: list[str]) -> int:
    with_stack, json_path, target, is_module, args = _parse(argv)
    from . import whole_run
    if json_path:
        json_path = os.path.abspath(json_path)     # the program may change directory
    sys.argv = [target, *args]      # for a module, runpy puts its file in argv[0], as python does
    if not is_module:
        sys.path[0] = os.path.dirname(os.path.abspath(target))
    whole_run.start(with_stack, json_path, what=target)
    code = 0
    try:
        if is_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        code = e.code
    except BaseException:     # noqa: BLE001 - reported as python does, then the exit status 1
        traceback.print_exc()
        code = 1
    finally:
        whole_run.finish()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
