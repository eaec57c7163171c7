"""The commands' synopsis in docs/commands.md, made from the commands themselves (whose options are made from the
declarations: engine/request.py, engine/options.py, live/options.py, serve/options.py), so it names every option
`--help` names. `python scripts/docs_synopsis.py` prints it; `--write` rewrites the block between the markers in
docs/commands.md; `--check` exits 1 when the committed block differs (tests/test_project_readme.py checks it too)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import click

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "commands.md"
BEGIN = "<!-- synopsis: made by scripts/docs_synopsis.py from the commands' declarations; do not edit by hand -->"
END = "<!-- /synopsis -->"
ORDER = ("register", "render", "batch", "avatars", "qc", "config", "checkpoints", "doctor", "serve", "live")
WIDTH = 118


def _metavar(param: click.Parameter, ctx: click.Context) -> str:
    """How a value of `param` is written: its metavar as --help shows it, a choice's brackets taken off."""
    kind = type(param.type)
    if kind in (click.IntRange, click.types.IntParamType) and param.metavar is None:
        return "N"
    if kind in (click.FloatRange, click.types.FloatParamType) and param.metavar is None:
        return "NUMBER"
    text = param.make_metavar(ctx)
    if text == "INTEGER":
        return "N"
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return text


def _words(command: click.Command, ctx: click.Context) -> list[str]:
    """The command's arguments and options, each one word of the synopsis: required ones bare, the others in []."""
    words, optional = [], []
    for p in command.get_params(ctx):
        if "--help" in p.opts or getattr(p, "hidden", False):
            continue
        if isinstance(p, click.Argument):
            word = _metavar(p, ctx)
            (words if p.required else optional).append(word if p.required else f"[{word}]")
            continue
        flag = "|".join(sorted(p.opts, key=len)) if len(p.opts) > 1 else p.opts[0]
        word = flag if p.is_flag else f"{flag} {_metavar(p, ctx)}" + (" ..." if p.multiple else "")
        (words if p.required else optional).append(word if p.required else f"[{word}]")
    return words + optional


def _wrap(head: str, words: list[str]) -> list[str]:
    """`head` and `words` in lines of at most WIDTH characters, continuation lines indented under the first word."""
    lines, line = [], head
    for w in words:
        if len(line) + 1 + len(w) > WIDTH and line.strip() != head.strip():
            lines.append(line)
            line = " " * len(head) + w
        else:
            line = f"{line} {w}" if line else w
    lines.append(line)
    return lines


def _commands(group: click.Group, ctx: click.Context, prefix: str):
    """(name, command, ctx) for each command under `group`, the subcommands of a group after it."""
    names = [n for n in ORDER if n in group.commands] if prefix == "ditto-fast" else list(group.commands)
    for name in names:
        command = group.commands[name]
        sub = click.Context(command, info_name=name, parent=ctx)
        yield f"{prefix} {name}", command, sub
        if isinstance(command, click.Group):
            yield from _commands(command, sub, f"{prefix} {name}")


def synopsis() -> str:
    """The synopsis of every command, one block of text."""
    sys.path.insert(0, str(REPO))
    from ditto_fast.cli import cli

    root = click.Context(cli, info_name="ditto-fast")
    lines = []
    for name, command, ctx in _commands(cli, root, "ditto-fast"):
        words = _words(command, ctx)
        if isinstance(command, click.Group):
            subs = "|".join(command.commands)
            words = [*words, f"[{subs} ...]"]
        lines += _wrap(name, words)
    return "\n".join(lines) + "\n"


def block() -> str:
    """The synopsis as it stands in docs/commands.md, markers and fence included."""
    return f"{BEGIN}\n```text\n{synopsis()}```\n{END}"


def committed() -> str:
    """The block as docs/commands.md holds it now."""
    text = DOC.read_text()
    return text[text.index(BEGIN):text.index(END) + len(END)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite the block in docs/commands.md")
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/commands.md's block is out of date")
    args = parser.parse_args()
    if args.write:
        DOC.write_text(DOC.read_text().replace(committed(), block()))
    elif args.check:
        if committed() != block():
            print("docs/commands.md: the synopsis is out of date; run python scripts/docs_synopsis.py --write",
                  file=sys.stderr)
            return 1
    else:
        print(synopsis(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
