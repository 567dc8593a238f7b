"""The one sequence every command follows, written once.

check the device (and the precision asked for on it) → build the config → make the out folder → run → print.

The first two refuse a request before anything is written: a device this
machine lacks, an option that contradicts another, a config the library
refuses (``ConfigError``). Only then is ``--out`` made, the work done, and the
result printed as a table or, with ``--json``, as JSON. A command is its
options plus a ``Command``: how its config is built from them, which library
call it makes, and how its result reads."""

from __future__ import annotations

import importlib
import json
import sys
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnscale.cli.options import UsageError, usable_device, writable_dir

__all__ = ["Command", "print_json", "table_of"]


def print_json(value: Any) -> None:
    from attnscale.files import to_jsonable

    json.dump(to_jsonable(value), sys.stdout, indent=2)
    sys.stdout.write("\n")


def table_of(module: str) -> Callable[[Any], str]:
    """``module``'s ``format_table`` (an experiment's, ``experiments.<name>``, or a full module path),
    imported only when a table is printed: torch loads with it."""
    path = module if "." in module else f"attnscale.experiments.{module}"
    return lambda result: importlib.import_module(path).format_table(result)


@dataclass(frozen=True)
class Command:
    """``config(args)``: the typed config (may raise ConfigError or UsageError);
    ``run(cfg, out, args)``: the library call, ``out`` None where the command's --out is optional and absent;
    ``show(result)``: the text printed without --json (None: nothing); ``as_json(result)``: what --json prints."""

    config: Callable[[Namespace], Any]
    run: Callable[[Any, Path | None, Namespace], Any]
    show: Callable[[Any], str]
    as_json: Callable[[Any], Any] = lambda result: result

    def __call__(self, args: Namespace) -> None:
        executor = getattr(args, "executor", "local")
        if getattr(args, "ray_address", None) and executor != "ray":
            raise UsageError("--ray-address joins a Ray cluster; add --executor ray")
        if getattr(args, "device", None) is not None:
            usable_device(args.device, executor, getattr(args, "dtype", None))  # Ray nodes' are checked there
        cfg = self.config(args)
        if getattr(args, "out", None) is not None:
            from attnscale.runs.writers import check_folder

            check_folder(args.out, args.command)  # the one folder rule, before the folder is made
        out = writable_dir(args.out) if getattr(args, "out", None) is not None else None
        result = self.run(cfg, out, args)
        if getattr(args, "json", False):
            print_json(self.as_json(result))
        elif (text := self.show(result)) is not None:  # None: the library printed as it went (reproduce)
            print(text)
