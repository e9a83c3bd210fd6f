"""`fa4-aot`: a thin click shell over the library, one module per concern.

    common.py      the --cache-dir store option and pass_store, --json/--variants options, output, error mapping
    build_cmds.py  skus, hosts, build
    model_cmds.py  models, coverage
    store_cmds.py  list, verify, gc, prune, misses, migrate
    server.py      serve, token, push, pull
    on_demand.py   builder, builds (on-demand builds of clients' misses)
    certify_cmds.py  certify (run the store's kernels on this GPU: verdicts), certifier (on-demand, on a GPU host)
    trust_cmds.py  keys, sign, revoke
    account.py     login, logout
    doctor.py      doctor
    known_bad_cmds.py  known-bad (the known-bad registry in force for a store and SKU)

This module only assembles the group. Command modules import from common, never from here (no import circle).
A Fa4AotError from any command becomes one line on stderr and exit 1 (common.Fa4AotGroup).
"""

from __future__ import annotations

from pathlib import Path

import click

from .. import __version__
from . import (
    account,
    build_cmds,
    certify_cmds,
    doctor,
    known_bad_cmds,
    model_cmds,
    on_demand,
    server,
    store_cmds,
    trust_cmds,
)
from .common import Fa4AotGroup, cache_dir_option, make_state


@click.group(cls=Fa4AotGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="fa4-aot")
@cache_dir_option
@click.pass_context
def main(ctx: click.Context, cache_dir: Path | None) -> None:
    """Ahead-of-time FlashAttention-4 kernels.

    \b
    Typical use:
      fa4-aot skus                      # the GPU SKUs variants.toml knows
      fa4-aot build --sku h200 --model llama-3.1-8b --tp 1 -j 2   # what one model runs (no GPU needed)
      fa4-aot build --sku h200 --dry-run   # the whole default matrix: its kernels and time estimate first
      fa4-aot build --sku h200 -j 16 --executor ray   # ...then build it on a farm
      fa4-aot coverage --sku h200 --calls calls.jsonl          # would these calls compile? (FA4_AOT_RECORD)
      fa4-aot list --sku h200           # what the store holds
      fa4-aot verify                    # re-hash every object
    Then on a GPU host: import fa4_aot; fa4_aot.install()  (or fa4_aot.load(q.shape, causal=True)).
    """
    ctx.obj = make_state(cache_dir)


COMMANDS = (
    build_cmds.skus, build_cmds.hosts, build_cmds.build, model_cmds.models_, model_cmds.coverage, store_cmds.list_,
    store_cmds.verify, store_cmds.gc, store_cmds.prune, store_cmds.misses, store_cmds.migrate, server.serve,
    server.token, server.push, server.pull, on_demand.builder, on_demand.builds, account.login, account.logout,
    trust_cmds.keys, trust_cmds.sign, trust_cmds.revoke, doctor.doctor, certify_cmds.certify,
    known_bad_cmds.known_bad_, certify_cmds.certifier,
)
for _command in COMMANDS:
    main.add_command(_command)

__all__ = ["main"]
