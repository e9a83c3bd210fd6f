"""What a model-driven build plans: a model's signatures per TP degree, each planned shape-complete (every
batch and sequence length, complete.py). `fa4-aot build --model` builds them; `fa4-aot coverage --model` judges
them."""

from __future__ import annotations

from dataclasses import dataclass

from ..domain.calls import Call
from ..domain.signature import Signature
from ..errors import ConfigError
from . import models

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


def valid_tps(model: models.Model) -> list[int]:
    """Every TP degree vLLM accepts for `model` (1 up to its query heads)."""
    return [tp for tp in range(1, model.heads + 1) if not isinstance(models.shard(model.heads, model.kv_heads, tp),
                                                                      str)]


def check_tps(model: models.Model, tps: tuple[int, ...]) -> None:
    """Refuse TP degrees given explicitly (--tp) that vLLM refuses for `model`: such a request plans no kernel,
    and a command that then builds or checks nothing must not look successful. ConfigError names the valid ones."""
    refused = [why for tp in tps if isinstance(why := models.shard(model.heads, model.kv_heads, tp), str)]
    if refused:
        valid = [str(tp) for tp in valid_tps(model)]  # never empty: TP 1 always divides
        choices = f"{', '.join(valid[:-1])} or {valid[-1]}" if len(valid) > 1 else valid[0]
        raise ConfigError(f"{model.name}: {'; '.join(refused)} (vLLM refuses it too): pass --tp {choices}")


def work(model: models.Model, tps: tuple[int, ...] = DEFAULT_TPS,
         workloads: tuple[str, ...] = models.WORKLOADS) -> list[tuple[str, Call | Signature]]:
    """(label, signature) pairs for compile.orchestrator.build_calls, which plans each signature at every shape."""
    return [(f"{model.name}-tp{i.tp}", i.signature) for i in items(model, tps, workloads)]
