"""The planner's refusals: work items the known-bad registry names are refused as FA4's own rejections are.

Every planning path goes through worker.plan_calls (a build and its dry run, `--from-misses`, the on-demand
builder, `fa4-aot coverage`), and it asks `refusal` twice per item: before FA4 plans it (the registry's signature
predicates) and after (entries a certification measured, which name kernel keys). A call matches when any entry
holds for its signature on the SKU's arch with the planning toolchain's versions, whatever the part: a training
call whose backward is bad is refused whole. A refused item is never built, recorded or published; its reason is
the entry's describe() (id, symptom, source).

The registry in force is the project's file plus what the store's certification measured for the SKU
(trust.certified.registry_for); FA4_AOT_CERTIFIED=off on the build host plans the items anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..domain.calls import Call
from ..domain.exact import ExactCall
from ..domain.known_bad import Bad, Registry
from ..domain.signature import Signature
from ..domain.skus import Sku
from ..store import Store
from ..trust import certified
from .commit import stored_key

NOTHING = Registry(0)  # what a build honours under FA4_AOT_CERTIFIED=off


def in_force(store: Store | None, sku: Sku) -> Registry:
    """The registry a build for `sku` honours: the project's file plus `store`'s measured entries for the SKU
    (without a store, the project's file alone); NOTHING under FA4_AOT_CERTIFIED=off. ConfigError for another
    policy value, StoreError for a malformed measured file (neither may mean that nothing is known bad)."""
    if certified.policy_from_env() == "off":
        return NOTHING
    if store is None:
        from ..domain import known_bad

        return known_bad.load()
    return certified.registry_for(store, sku.name)


def signature_of(item: Call | ExactCall | Signature) -> Signature | None:
    """The signature a work item calls with; None for an exact record its client could not summarise as a Call
    (score_mod, block sparsity...): the registry's predicates cannot be judged for it."""
    if isinstance(item, Signature):
        return item
    call = item.call if isinstance(item, ExactCall) else item
    return Signature.of(call) if call is not None else None


def refusal(registry: Registry, sku: Sku, versions: Mapping[str, str], sig: Signature | None,
            kernel_keys: Iterable[str] = ()) -> Bad | None:
    """The entry that refuses a call of `sig` on `sku` planned by a toolchain of `versions` (fa4.toolchain()), or
    None. Without `kernel_keys` only entries that name no kernel can match (judged before planning); with them,
    an entry naming any of those kernels matches too (judged after)."""
    if sig is None or not registry.entries:
        return None
    values = sig.to_dict()
    found = registry.find(values, arch=sku.arch, versions=versions, sku=sku.name)
    for key in kernel_keys:
        if found is not None:
            break
        found = registry.find(values, arch=sku.arch, versions=versions, sku=sku.name, kernel_key=key)
    return found


def kernel_names(registry: Registry, store: Store | None, sku: Sku, base_keys: Iterable[str]) -> list[str]:
    """The keys that name the kernels `base_keys` for `refusal`: their base keys and, for a kernel `store` holds
    for `sku` under its full key (it consumed SKU constants), that key too, which certification's verdicts and
    measured entries name. [] when no entry of `registry` names kernels (nothing to look up)."""
    if not any(bad.kernel_keys for bad in registry.entries):
        return []
    keys = list(base_keys)
    held = [stored_key(store, key, sku) for key in keys] if store is not None else []
    return keys + [key for key in held if key is not None and key not in keys]
