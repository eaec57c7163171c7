"""The commands' shared options, made from the declarations: the engine's (EngineOptions' fields) and the render
request's (RenderRequest's fields), each checked by its config declaration; `--config` and `--quiet`; and the
progress display the long commands show on stderr."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from pathlib import Path

import click

from ditto_fast.core.config import check_setting, declaration, default, load_config
from ditto_fast.core.errors import DittoError
from ditto_fast.engine.options import ENGINE_FIELDS, EngineOptions
from ditto_fast.engine.request import FIELDS


PATH = click.Path(path_type=Path, readable=False)   # a file named: the command checks it (exit 3 in one line)


class DeclaredSetting(click.ParamType):
    """An option checked by its config declaration (`section.key`): the same values refused with the same message
    as in a job line, a config file or a RenderRequest made in Python."""

    def __init__(self, section: str, key: str):
        self.section, self.key = section, key
        self.decl = declaration(section, key)
        self.name = "|".join(self.decl["choices"]) if self.decl["choices"] else \
            "|".join(("N", *self.decl["words"])) if self.decl["words"] else \
            "INTEGER" if self.decl["kind"] is int else "NUMBER" if self.decl["kind"] is float else "TEXT"

    def get_metavar(self, param, ctx=None) -> str:
        return f"[{self.name}]" if self.decl["choices"] else self.name

    def convert(self, value, param, ctx):
        if self.decl["kind"] in (int, float) and isinstance(value, str):
            try:
                value = self.decl["kind"](value)
            except ValueError:
                pass                            # refused below, with the setting's own message
        try:
            return check_setting(self.section, self.key, value, "")
        except DittoError as e:                 # the setting's UsageError; click names the option
            self.fail(str(e).strip(), param, ctx)


def default_help(section: str, key: str) -> str:
    """' [default: VALUE]' for a help text, read from the packaged settings."""
    return f" [default: {default(section, key)}; config {section}.{key}]"


class SettingOption(click.Option):
    """An option checked by a config declaration whose help names the setting's packaged default; the default is
    read when the help is shown, so a command that shows none (a usage error, --version) reads no YAML."""

    def __init__(self, *args, setting: tuple[str, str], help_tail: str = "", **kwargs):
        self.setting, self.help_tail = setting, help_tail
        super().__init__(*args, type=DeclaredSetting(*setting), **kwargs)

    @property
    def help(self) -> str:
        return f"{self._help or ''}{default_help(*self.setting)}{self.help_tail}"

    @help.setter
    def help(self, text: str | None) -> None:
        self._help = text


def setting_option(*decls: str, setting: tuple[str, str], help: str, help_tail: str = "", **kwargs):
    """An option checked by the config declaration `setting` (section, key), its default named in its help (then
    `help_tail`)."""
    return click.option(*decls, cls=SettingOption, setting=setting, default=None, help=help, help_tail=help_tail,
                        **kwargs)


METAVARS = {"rate": "RATE", "profile": "NAME|FILE", "loudness": "off|LUFS", "timecode": "HH:MM:SS:FF"}


def _param_type(meta) -> click.ParamType | None:
    """The click type of a declared field without a setting: choices, a path, or a number in a range."""
    if meta["choices"]:
        return click.Choice(meta["choices"])
    if meta["kind"] == "path":
        return PATH
    if meta["kind"] in ("int", "float"):
        return (click.IntRange if meta["kind"] == "int" else click.FloatRange)(*meta["range"])
    return None


def field_option(f: dataclasses.Field, job_default: bool = False):
    """A declared field (core/declare.py: EngineOptions', RenderRequest's, ServeOptions') as a click option, its
    flags, type, default and help from its declaration; with `job_default` it is the default of a batch's jobs
    (never required, and a job's own value wins)."""
    meta = f.metadata
    tail = f' A job\'s own "{f.name}" wins.' if job_default else ""
    kwargs = dict(required=meta["required"] and not job_default, metavar=METAVARS.get(meta["kind"]))
    if meta["setting"]:
        return setting_option(*meta["flags"], f.name, setting=meta["setting"], help=meta["help"], help_tail=tail,
                              **kwargs)
    default = None if f.default is dataclasses.MISSING else f.default
    if meta["kind"] == "flag":          # on when given; off (or the job's own) when not
        return click.option(*meta["flags"], f.name, is_flag=True, default=None, help=meta["help"] + tail or None)
    return click.option(*meta["flags"], f.name, type=_param_type(meta), default=default,
                        show_default=default is not None, multiple=meta["multiple"],
                        help=meta["help"] + tail or None, **kwargs)


def field_options(fields: tuple[dataclasses.Field, ...], skip: tuple[str, ...] = (), job_default: bool = False):
    """A decorator giving a command the options of `fields` (those with flags, less `skip`), in their order."""
    def decorate(command):
        for f in reversed(fields):
            if f.metadata.get("flags") and f.name not in skip:
                command = field_option(f, job_default)(command)
        return command
    return decorate


def take(values: dict, fields: tuple[dataclasses.Field, ...]) -> dict:
    """The values of `fields`' options, taken out of a command's `values`."""
    return {f.name: values.pop(f.name) for f in fields if f.metadata.get("flags")}


ENGINE = {f.name: field_option(f) for f in ENGINE_FIELDS if f.metadata["flags"]}    # --checkpoints, --device...
CONFIG = click.option("--config", "config_path", type=PATH, default=None,
                      help="YAML overriding some settings (`ditto-fast config` prints them all).")
QUIET = click.option("--quiet", is_flag=True, help="No progress bar or tables on stderr (serve: log errors only).")
engine_options = field_options(ENGINE_FIELDS)          # render's, batch's and serve's


def take_engine_options(values: dict, config_path: Path | None) -> EngineOptions:
    """The engine's options, taken out of a command's `values`, with the settings of `config_path` (the packaged
    defaults when None)."""
    return EngineOptions(config=load_config(config_path), **take(values, ENGINE_FIELDS))


def request_options(skip: tuple[str, ...] = (), job_default: bool = False):
    """The render request's fields as click options, leaving out `skip`; with `job_default` each one is the default
    of a batch's jobs."""
    return field_options(FIELDS, skip, job_default)


@contextmanager
def progress_bar(label: str, quiet: bool):
    """A progress callback (stage, done, total) on stderr (bars on a terminal, plain lines in a log; see
    ditto_fast/engine/progress.py); None when quiet."""
    if quiet:
        yield None
        return
    from ditto_fast.engine.progress import ProgressReport

    report = ProgressReport(label)
    try:
        yield report
    finally:
        report.close()
