"""Click's usage errors in the one-line form of every other vgpu error: what was typed (the flag
and its value, the unknown command), then what is wrong, then where the help is."""

import re

# Typer carries its own copy of click; its errors and parameters are these.
from typer._click import exceptions as click
from typer._click.core import Parameter

# Phrases of click and of pydantic-style conversions that say nothing the line does not.
_NOISE = (
    (re.compile(r"^Invalid value for [^:]*: "), ""),
    (re.compile(r"^Value error, "), ""),
    (re.compile(r"^Input should be "), "should be "),
    (re.compile(r"^'[^']*' is not one of "), "expected one of "),
    (re.compile(r"^No such command '([^']*)'\.\s*"), r"\1: no such command. "),
    (re.compile(r"\.\s+Did you mean "), "; did you mean "),
)


def _typed(param: Parameter, args: list[str]) -> str:
    """The flag and the value typed for ``param`` (its last occurrence), or its name."""
    if param.param_type_name != "option":
        return param.metavar or (param.name or "argument").upper()
    flags = [*param.opts, *param.secondary_opts]
    found = param.opts[0]
    for number, arg in enumerate(args):
        if arg == "--":
            break
        for flag in flags:
            if arg == flag:
                value = (
                    args[number + 1]
                    if number + 1 < len(args) and not getattr(param, "is_flag", False)
                    else ""
                )
                found = f"{flag} {value}".rstrip()
            elif flag.startswith("--") and arg.startswith(flag + "="):
                found = f"{flag} {arg[len(flag) + 1 :]}"
            elif len(flag) == 2 and not flag.startswith("--") and arg.startswith(flag):
                found = f"{flag} {arg[2:]}"
    return found


def _reason(error: click.ClickException) -> str:
    message = error.format_message() if isinstance(error, click.BadParameter) else error.message
    for pattern, replacement in _NOISE:
        message = pattern.sub(replacement, message)
    message = " ".join(message.split())  # one line
    return message[:1].lower() + message[1:].rstrip(".")


def one_line(error: click.ClickException, args: list[str]) -> str:
    """The line (without "error: ") for ``error``, raised while parsing ``args``."""
    context = error.ctx if isinstance(error, click.UsageError) else None
    where = f" (see '{context.command_path} --help')" if context is not None else ""
    param = error.param if isinstance(error, click.BadParameter) else None
    if isinstance(error, click.MissingParameter):
        return f"{_reason(error)}{where}"
    if param is not None:
        return f"{_typed(param, args)}: {_reason(error)}{where}"
    if isinstance(error, click.NoSuchOption):
        hint = ""
        if error.possibilities:
            hint = f"; did you mean {' or '.join(sorted(error.possibilities))}?"
        return f"{error.option_name}: no such flag{hint}{where}"
    return f"{_reason(error)}{where}"
