"""Command-line options generated from a config dataclass, so that every command shows the same flags with the
defaults and help written once, on the config's fields (``PolicyConfig``, ``EngineConfig``)."""

from __future__ import annotations

import dataclasses
import types
import typing

import click


def _fields(cls, exclude=()) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.name not in exclude and "help" in f.metadata]


def _option_type(hint):
    """(click type, is a flag) for a field's type hint (``int``, ``float``, ``str``, ``bool`` or ``X | None``)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = args[0]
    if hint is bool:
        return None, True
    return hint, False


def config_options(cls, exclude=(), show_default: bool = True):
    """A decorator that adds one click option per field of the dataclass ``cls`` (except ``exclude``): the flag
    ``--field-name`` (or the field's ``flags`` metadata; booleans get an on/off pair), the field's type, default
    and ``help`` metadata. The command receives each value under the field's name."""
    hints = typing.get_type_hints(cls)

    def decorate(command):
        for f in reversed(_fields(cls, exclude)):
            kind, is_flag = _option_type(hints[f.name])
            name = f.name.replace("_", "-")
            decls = f.metadata.get("flags") or ((f"--{name}/--no-{name}",) if is_flag else (f"--{name}",))
            default = f.default if f.default is not dataclasses.MISSING else None
            kwargs = {"default": default, "help": f.metadata["help"],
                      "show_default": show_default and default is not None}
            if not is_flag:
                kwargs["type"] = kind
            elif not any("/" in d for d in decls):  # a flag that only turns the option on
                kwargs["is_flag"] = True
            command = click.option(*decls, f.name, **kwargs)(command)
        return command

    return decorate


def pick(cls, options: dict) -> dict:
    """The entries of ``options`` that are fields of the dataclass ``cls``."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in options.items() if k in names}


def config_flags(cls, options: dict) -> list[str]:
    """The command-line flags that pass ``options`` (field name -> value; None is left out) to a command whose
    options ``config_options(cls)`` made: the inverse of that decorator, e.g. for a replica's command line."""
    hints = typing.get_type_hints(cls)
    flags = []
    for f in _fields(cls):
        value = options.get(f.name)
        if value is None:
            continue
        decl = (f.metadata.get("flags") or (f"--{f.name.replace('_', '-')}",))[0]
        if _option_type(hints[f.name])[1]:
            on, _, off = decl.partition("/")
            flag = on if value else off
            if flag:
                flags.append(flag)
        else:
            flags += [decl, str(value)]
    return flags
