"""`fa4-aot builder` and `fa4-aot builds`: on-demand builds of what clients miss (fa4_aot/compile/builder.py)."""

from __future__ import annotations

import functools
import logging
import os
import socket
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..store import Store
from .building import executor_for
from .common import emit, json_option, load_matrix, pass_store, remote_for, variants_option
from .stopping import on_signals

if TYPE_CHECKING:
    from ..domain.misses import BuildJob


@click.command()
@click.option("--server", required=True, envvar="FA4_AOT_SERVER", help="The server whose build jobs to run "
              "($FA4_AOT_SERVER).")
@click.option("--token", envvar="FA4_AOT_TOKEN", help="A publish token ($FA4_AOT_TOKEN): claims jobs, publishes.")
@click.option("-j", "--jobs", default=max(1, (os.cpu_count() or 2) - 1), show_default="CPUs - 1",
              type=click.IntRange(min=1), help="Compiler processes (local executor; kept warm between jobs).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: a process pool here; ray: tasks on a Ray cluster (pip install 'fa4-aot[farm]').")
@click.option("--ray-address", envvar="RAY_ADDRESS", help="Ray cluster to use ($RAY_ADDRESS).")
@click.option("--ray-node-ip", envvar="FA4_AOT_RAY_NODE_IP", help="This host's address in the Ray cluster, when "
              "Ray cannot tell it ($FA4_AOT_RAY_NODE_IP).")
@click.option("--lease", default=60.0, show_default=True, type=click.FloatRange(min=10, max=600),
              help="Seconds a claimed job stays this builder's without renewal; renewed every third of it. A builder "
                   "that dies loses its job to the next claim after this long.")
@click.option("--poll", default=1.0, show_default=True, type=click.FloatRange(min=0.05),
              help="Seconds between claims while the queue is empty.")
@click.option("--name", default=lambda: f"{socket.gethostname()}-{os.getpid()}", show_default="host-pid",
              help="This builder's name in the jobs it holds.")
@click.option("--signing-key", type=click.Path(dir_okay=False, path_type=Path), envvar="FA4_AOT_SIGNING_KEY",
              help="Sign a manifest of what it publishes with this private key ($FA4_AOT_SIGNING_KEY).")
@click.option("--max-jobs", type=click.IntRange(min=1), help="Exit after this many jobs (default: run until stopped).")
@variants_option("The SKU table (default: variants.toml); the server's SKUs must be in it.")
@pass_store
def builder(store: Store, server: str, token: str | None, jobs: int, executor: str, ray_address: str | None,
            ray_node_ip: str | None, lease: float, poll: float, name: str, signing_key: Path | None,
            max_jobs: int | None, variants_file: Path | None) -> None:
    """Build what clients miss, once for the whole cluster: claim the server's build jobs (a job per missed
    kernel or lean call and SKU, however many clients miss it), build each into this store on the executor, and
    publish it as `fa4-aot push` does. Run one or more next to `fa4-aot serve` on CPU hosts; clients with
    FA4_AOT_BUILD_WAIT=SECONDS wait for the job instead of failing. Stops on SIGINT/SIGTERM; a job it held is
    taken over by the next claim once its lease runs out."""
    from ..compile.builder import Builder, wait_for_server
    from ..remote.credentials import token_for
    from ..remote.http import Remote

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per claim would bury the jobs' lines
    matrix = load_matrix(variants_file)
    ex = executor_for(executor, jobs, ray_address, ray_node_ip, None, token)
    first = remote_for(server, token)
    wait_for_server(first, 60.0)
    # remotes are made again in other threads (lease renewals), where there is no click context to ask
    again = functools.partial(Remote, first.url, token=token or token_for(server), advice=first.advice)
    worker = Builder(again, matrix, store, ex, name, lease=lease, poll=poll, signing_key=signing_key)
    click.echo(f"builder {name}: running {server}'s build jobs into {store.root} on {ex.name} ({jobs} job(s))",
               err=True)
    with on_signals() as stop:
        try:
            worker.run(threading.Event(), max_jobs=max_jobs)
        except KeyboardInterrupt:
            click.echo(f"builder {name}: stopped after {worker.done} job(s)", err=True)
            ex.close(stop=True)
            sys.exit(stop.exit_code)
    ex.close()


@click.command()
@click.option("--server", required=True, envvar="FA4_AOT_SERVER", help="The server ($FA4_AOT_SERVER).")
@click.option("--token", envvar="FA4_AOT_TOKEN", help="A read token, when the server wants one ($FA4_AOT_TOKEN).")
@click.option("--status", type=click.Choice(["queued", "running", "done", "failed", "rejected"]),
              help="Only jobs in this state.")
@click.option("--id", "job_id", type=click.IntRange(min=1), help="One job, with its detail.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@json_option()
def builds(server: str, token: str | None, status: str | None, job_id: int | None, limit: int,
           as_json: bool) -> None:
    """The server's build jobs, newest first: state, reports, compile seconds and why one failed."""
    remote = remote_for(server, token)
    found = [remote.build(job_id)] if job_id else remote.builds(status, limit)
    lines = [f"{j.id:>6} {j.status:<8} {j.sku} {_what(j)} {j.kernel_key[:16]} reports={j.reports} built={j.built} "
             f"{j.compile_seconds:.1f} CPU-s" + (f"\n       {j.detail}" if j.detail and (job_id or j.status != "done")
                                                 else "")
             for j in found]
    docs = [j.to_dict() for j in found]
    emit(as_json, docs[0] if job_id else docs, "\n".join(lines) or f"{server} has no build jobs")


def _what(job: BuildJob) -> str:
    """What a job builds, as a person reads it: the call it carries (its model's shapes, mask, dtype), else its
    FA4 family (a job from a client that could not describe its call)."""
    from ..domain.calls import Call

    try:
        return f"{job.family}: {Call.from_dict(job.call).describe()}" if job.call else job.family
    except (TypeError, KeyError, ValueError):  # a call this fa4-aot cannot read: a server holds other clients' jobs
        return job.family
