"""What every `fa4-aot` command shares: the store option and `pass_store`, the variants and --json options,
JSON-or-text output, and the one place where Fa4AotError becomes a click error (one line on stderr, exit 1; with
--json, one JSON document on stdout).

Command modules import from here, never from the group module (`fa4_aot.cli`), so there is no import circle.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import click

from .. import config
from ..errors import Fa4AotError
from ..store import Store
from .terminal import printable

if TYPE_CHECKING:
    from ..matrix.variants import Matrix
    from ..remote.http import Remote

P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])


class Fa4AotGroup(click.Group):
    """The top-level group: any Fa4AotError raised by a command, in any subgroup, ends here as one line; every
    command added to it (and every subcommand of an added group) accepts --cache-dir after its name."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        accept_cache_dir(cmd)
        super().add_command(cmd, name)

    def invoke(self, ctx: click.Context) -> Any:
        as_json = "--json" in ctx.args[: ctx.args.index("--")] if "--" in ctx.args else "--json" in ctx.args
        try:
            return super().invoke(ctx)
        except Fa4AotError as e:
            raise (JsonError(str(e), 1) if as_json else click.ClickException(printable(str(e)))) from e
        except click.ClickException as e:  # usage errors too: a --json caller parses stdout whatever failed
            if not as_json or isinstance(e, JsonError):
                raise
            raise JsonError(e.format_message(), e.exit_code) from e


class JsonError(click.ClickException):
    """An error of a command given --json: one JSON document on stdout ({"error": message, "exit_code": N}),
    so a caller that parses stdout reads the failure too; the exit status is unchanged."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click declares it on the class; this one varies

    def show(self, file: Any = None) -> None:
        click.echo(json.dumps({"error": self.message, "exit_code": self.exit_code}))


class NoGpu(click.ClickException):
    """A command that runs kernels, on a host without a usable GPU: exit 2 (1 is "a kernel failed")."""

    exit_code = 2


@dataclass
class State:
    """ctx.obj: the store folder as given, and the Store built from it on first use (never before: a
    command that does not touch the store must not depend on it)."""

    cache_dir: Path
    _store: Store | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self.cache_dir)
        return self._store


cache_dir_option = click.option(
    "--cache-dir", type=click.Path(file_okay=False, path_type=Path), envvar="FA4_AOT_CACHE",
    help="Kernel store (default: $FA4_AOT_CACHE, else cache/ of this checkout, else ~/.cache/fa4-aot).")


def make_state(cache_dir: Path | None) -> State:
    return State(cache_dir or config.default_cache_dir())


def state() -> State:
    """The running command's State (set by the group from --cache-dir)."""
    found = click.get_current_context().find_object(State)
    if found is None:  # a command invoked without the group, e.g. in a test: the default store
        found = make_state(None)
    return found


def _cache_dir_here(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    """--cache-dir given after the command name (`fa4-aot list --cache-dir X`) overrides the group's."""
    if value is not None:
        found = ctx.find_object(State)
        if found is not None:
            found.cache_dir, found._store = value, None


def _cache_dir_after() -> click.Option:
    return click.Option(["--cache-dir"], type=click.Path(file_okay=False, path_type=Path), expose_value=False,
                        callback=_cache_dir_here, help="Kernel store (as the option before the command name).")


def accept_cache_dir(cmd: click.Command) -> None:
    """Let `cmd`, and every subcommand when it is a group, take --cache-dir after its name (`fa4-aot serve
    --cache-dir X`, `fa4-aot token create --cache-dir X`): the global option is accepted wherever a user writes
    it, as pip and huggingface-cli users expect. A command that already declares it keeps its own."""
    if not any("--cache-dir" in getattr(p, "opts", ()) for p in cmd.params):
        cmd.params.append(_cache_dir_after())
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            accept_cache_dir(sub)


def pass_store(f: Callable[Concatenate[Store, P], R]) -> Callable[P, R]:
    """Give the command the Store of --cache-dir as its first argument (built once per invocation). The option
    is accepted before the command name and after it (accept_cache_dir)."""

    @functools.wraps(f)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        return f(state().store, *args, **kwargs)

    return wrapper


def existing(store: Store) -> Store:
    """`store`, when its folder holds a store (store.root.holds_store): a command that only reads must not report a
    mistyped path as an empty store."""
    from ..store.root import holds_store

    if not holds_store(store.root):
        raise Fa4AotError(f"no store at {store.root}: check --cache-dir or FA4_AOT_CACHE (a store is made by "
                          "`fa4-aot build --sku NAME` or `fa4-aot pull`)")
    return store


def check_sku(name: str, *elsewhere: Iterable[str]) -> None:
    """Refuse a SKU name that is neither in the SKU table (variants.toml) nor among `elsewhere` (a store's SKUs,
    a server's): UnknownSku with a "did you mean". Every command taking --sku checks it so (build, coverage and
    sign through the table alone, as they need a SKU's facts)."""
    from ..domain.sku_table import check_name

    try:
        table = list(load_matrix(None).skus)
    except Fa4AotError:  # no readable table: the other names still judge
        table = []
    check_name(name, table, *elsewhere)


def server_skus(remote: Remote) -> set[str]:
    """The names of the SKUs `remote` holds kernels for."""
    return {str(s.get("name", s.get("sku", ""))) for s in remote.skus()}


def remote_for(server: str, token: str | None, param: str = "server") -> Remote:
    """A Remote for a command's --server: refused at once under FA4_AOT_OFFLINE=1 (the command needs the
    network) or without a scheme; a connection error advises on the option or the variable that gave the URL."""
    import os

    from ..remote.http import Remote
    from ..remote.transport import ENV_ADVICE

    if os.environ.get("FA4_AOT_OFFLINE") == "1":
        raise Fa4AotError(f"FA4_AOT_OFFLINE=1 forbids the network, and this command talks to {server}: unset "
                          "FA4_AOT_OFFLINE to run it")
    if token is None:
        from ..remote.credentials import token_for

        token = token_for(server)
    source = click.get_current_context().get_parameter_source(param)
    from_env = source is click.core.ParameterSource.ENVIRONMENT
    advice = ENV_ADVICE if from_env else "check the --server URL, and that `fa4-aot serve` runs there"
    return Remote(server, token=token, advice=advice)


def json_option(help: str = "Print one JSON document.") -> Callable[[F], F]:
    return click.option("--json", "as_json", is_flag=True, help=help)


def variants_option(help: str | None = "Variant matrix (default: variants.toml).") -> Callable[[F], F]:
    return click.option("--variants", "variants_file", type=click.Path(dir_okay=False, path_type=Path),
                        envvar="FA4_AOT_VARIANTS", help=help)


def load_matrix(path: Path | None) -> Matrix:
    """variants.toml (or `path`), parsed; ConfigError names the file, line and field."""
    from ..matrix import variants

    return variants.load(path or config.default_variants_file())


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity, as a container or `taskset` limits it), at least 1."""
    import os

    counted = getattr(os, "process_cpu_count", None)  # Python 3.13+
    if counted is not None:
        return counted() or 1
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity on this platform (macOS)
        return os.cpu_count() or 1


def plural(n: int, word: str, many: str | None = None) -> str:
    """`n` and the word for that many: "1 kernel", "2 kernels", "3 entries" (plural(3, "entry", "entries"))."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def emit(as_json: bool, doc: Any, text: str) -> None:
    """Print `doc` as one JSON document with --json, else the human text, its control characters escaped
    (terminal.printable: it quotes what servers said)."""
    click.echo(json.dumps(doc, indent=1, sort_keys=True) if as_json else printable(text))
