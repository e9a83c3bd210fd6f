"""What a model-driven build plans: a model's signatures per TP degree, each expanded into the calls whose
kernels make up its plan for a SKU. `fa4-aot build --model` builds them; `fa4-aot coverage --model` judges them."""

from __future__ import annotations

from dataclasses import dataclass

from . import models
from .calls import Call
from .signature import Signature
from .skus import Sku

DEFAULT_TPS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Item:
    model: str
    tp: int
    workloads: tuple[str, ...]
    signature: Signature

    @property
    def label(self) -> str:
        s = self.signature
        return f"{self.model} tp{self.tp}: {s.call(1, 1, 1).describe().split(' b=')[0]} h={s.heads_q}/{s.heads_kv}" + (
            f" page_size={s.page_size}" if s.layout == "paged" else "")


def items(model: models.Model, tps: tuple[int, ...] = DEFAULT_TPS,
          workloads: tuple[str, ...] = models.WORKLOADS) -> list[Item]:
    """Every (tp, signature) of `model`; TP degrees vLLM refuses for it contribute none."""
    return [Item(model.name, tp, tuple(workloads), s) for tp in tps for s in models.signatures(model, tp, workloads)]


def skipped(model: models.Model, tps: tuple[int, ...]) -> list[str]:
    """Why each refused TP degree of `model` was left out."""
    out = []
    for tp in tps:
        why = models.shard(model.heads, model.kv_heads, tp)
        if isinstance(why, str):
            out.append(f"{model.name}: {why} (vLLM refuses it too); left out")
    return out


def signature_calls(sig: Signature, sku: Sku) -> list[Call]:
    """The calls whose kernels make up `sig`'s plan for `sku`: sequence lengths from 1 to 64k (and past the
    query for chunked prefill and decode), short and odd lengths, batch 1 to 64."""
    del sku  # the SKU enters through the process that plans these calls
    if sig.layout in ("paged", "seqused"):
        pairs = [(1, k) for k in (1, 100, 1024, 8192, 65536)] + [(4, 4096), (128, 1024), (2048, 8192)]
    elif sig.pass_ in ("bwd", "bwd_det"):
        pairs = [(n, n) for n in (1, 77, 128, 512, 1000, 4096, 16384)]
    else:
        pairs = [(n, n) for n in (1, 77, 128, 512, 1000, 4096, 16384, 65536)]
        pairs += [(1, 1024), (1, 65536), (512, 8192), (2048, 16384), (4096, 1024)]
    return [sig.call(b, q, k) for b in (1, 3, 64) for q, k in pairs]


def work(model: models.Model, sku: Sku, tps: tuple[int, ...] = DEFAULT_TPS,
         workloads: tuple[str, ...] = models.WORKLOADS) -> list[tuple[str, Call]]:
    """(label, call) pairs for build.build_calls."""
    return [(f"{model.name}-tp{i.tp}", c) for i in items(model, tps, workloads)
            for c in signature_calls(i.signature, sku)]
