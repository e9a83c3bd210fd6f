"""`fa4-aot certifier`: on-demand certification of what builders publish, on a GPU host (certify/certifier.py)."""

from __future__ import annotations

import functools
import logging
import os
import socket
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from ..errors import Fa4AotError
from ..store import Store
from .common import load_matrix, pass_store, remote_for, variants_option
from .stopping import on_signals

if TYPE_CHECKING:
    from ..spec.skus import Sku
    from ..spec.verdicts import DeviceClass

NO_GPU = 2  # exit status on a host without a usable GPU: nothing there can certify


@click.command()
@click.option("--server", required=True, envvar="FA4_AOT_SERVER", help="The server whose certify jobs to run "
              "($FA4_AOT_SERVER).")
@click.option("--token", envvar="FA4_AOT_TOKEN", help="A publish token allowed this GPU's SKU ($FA4_AOT_TOKEN): "
              "claims jobs, records verdicts.")
@click.option("--lease", default=120.0, show_default=True, type=click.FloatRange(min=10, max=3600),
              help="Seconds a claimed job stays this certifier's without renewal; renewed every third of it. A "
                   "certifier that dies loses its job to the next claim after this long.")
@click.option("--poll", default=2.0, show_default=True, type=click.FloatRange(min=0.05),
              help="Seconds between claims while the queue is empty.")
@click.option("--name", default=lambda: f"{socket.gethostname()}-{os.getpid()}", show_default="host-pid",
              help="This certifier's name in the jobs it holds.")
@click.option("--once", is_flag=True, help="Certify at most one job (none when none is queued), then exit.")
@variants_option("The SKU table (default: variants.toml): this GPU's SKU must be in it.")
@pass_store
def certifier(store: Store, server: str, token: str | None, lease: float, poll: float, name: str, once: bool,
              variants_file: Path | None) -> None:
    """Certify what builders publish before clients run it: claim the server's certify jobs for this GPU's SKU (a
    job per published kernel), pull each job's kernels and recipe files into this store, run them on this GPU
    against an fp32 reference (as `fa4-aot certify` does) and record the verdicts on the server. Clients with
    FA4_AOT_CERTIFIED=require and FA4_AOT_BUILD_WAIT get a built kernel once it passed. Needs a GPU of the SKU
    (exit 2 without one) and a publish token allowed it. Stops on SIGINT/SIGTERM, giving back the job it holds."""
    from ..certify.certifier import Certifier
    from ..remote.credentials import token_for
    from ..remote.http import Remote

    sku, device = gpu_sku(variants_file)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per claim would bury the jobs' lines
    first = remote_for(server, token)
    check_trust(store, sku, first)
    # remotes are made again in other threads (lease renewals), where there is no click context to ask
    again = functools.partial(Remote, first.url, token=token or token_for(server), advice=first.advice)
    worker = Certifier(again, store, sku, device, name, lease=lease, poll=poll)
    click.echo(f"certifier {name}: certifying {server}'s {sku.name} jobs on {device} into {store.root}", err=True)
    with on_signals() as stop:
        try:
            if once:
                worker.run_one()
            else:
                worker.run(threading.Event())
        except KeyboardInterrupt:
            click.echo(f"certifier {name}: stopped after {worker.done} job(s)", err=True)
            sys.exit(stop.exit_code)


def gpu_sku(variants_file: Path | None) -> tuple[Sku, DeviceClass]:
    """(the SKU row of this host's GPU, its device class); exits NO_GPU with why when there is no GPU, or the GPU
    is not exactly a row of the table (a verdict holds only for the GPU that measured it)."""
    from ..spec import hosts
    from ..spec.devices import detect_device, device_class
    from ..spec.matching import select

    device = device_class()
    if device is None:
        _no_gpu("no CUDA device is visible here, and a certifier runs kernels: start `fa4-aot certifier` on a GPU "
                "host of the SKU to certify (`fa4-aot skus --detect` there names its SKU)")
    info = detect_device()
    try:
        sku, _constants, _trace = select(load_matrix(variants_file).skus, info, cpu=hosts.detect())
    except Fa4AotError as e:
        _no_gpu(f"this GPU ({info.name}) matches no SKU of the table: {e}")
    arch = f"sm_{info.capability[0]}{info.capability[1]}a"
    if (arch, info.sm_count) != (sku.arch, sku.sm_count):
        _no_gpu(f"this GPU ({info.name}: {arch}, {info.sm_count} SMs) is served by SKU {sku.name} ({sku.arch}, "
                f"{sku.sm_count} SMs) but is not one: a verdict holds only for the GPU that measured it; add its "
                "row (`fa4-aot skus --detect` prints it) or certify on a GPU of the SKU")
    return sku, device


def check_trust(store: Store, sku: Sku, remote: object) -> None:
    """Refuse at start what every job would fail on: remote kernels the client's trust policy refuses."""
    from ..trust.policy import Trust

    refusal = Trust.from_env(sku, store, remote).refuse_remote()
    if refusal:
        raise Fa4AotError(f"the certifier fetches the kernels it certifies from the server, and {refusal}")


def _no_gpu(why: str) -> NoReturn:
    click.echo(f"Error: {why}", err=True)
    sys.exit(NO_GPU)
