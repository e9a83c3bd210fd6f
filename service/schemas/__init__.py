"""Pydantic request and response models of the HTTP API (apart from the ORM models in models.py)."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from fa4_aot.domain import call_ranges, exact, hosts
from fa4_aot.domain.calls import Call
from fa4_aot.domain.kernel_keys import dumps as canonical_json
from fa4_aot.domain.misses import LEAN_FAMILY, Miss, lean_key

HEX64 = r"^[0-9a-f]{64}$"
KEY_ID = r"^[0-9a-f]{16}$"
SKU_NAME = r"^[a-z0-9][a-z0-9-]*$"

Hex64 = Annotated[str, Field(pattern=HEX64, min_length=64, max_length=64, description="64 lowercase hex digits")]
SkuName = Annotated[str, Field(pattern=SKU_NAME, min_length=1, max_length=64, description="e.g. h200, b200")]
Scope = Literal["read", "publish", "admin"]


def _storable(value: str) -> str:
    """Text every database can store: valid UTF-8 (no lone surrogates) and no NUL, which PostgreSQL refuses."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (it holds an unpaired surrogate)") from None
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


Text = Annotated[str, AfterValidator(_storable)]
MAX_JSON_DEPTH = 32  # compile keys nest 3 deep; JSON nested far deeper makes encoders recurse past Python's limit
MAX_JSON_CHARS = 16 << 10  # a real compile key is under 2 KiB as JSON
MAX_MISS_KEY_CHARS = 4 << 10  # a miss's compile key, stored with the miss and again with its build job


def check_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> Any:
    """`value` if its dicts and lists nest at most `limit` deep (checked without recursion), else ValueError."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            raise ValueError(f"JSON nested more than {limit} deep")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return value


def _bounded(value: Any) -> Any:
    """A free-form JSON value (compile key, hardware queries): check_depth, and at most MAX_JSON_CHARS long as
    compact JSON."""
    check_depth(value)
    if len(json.dumps(value, separators=(",", ":"))) > MAX_JSON_CHARS:
        raise ValueError(f"longer than {MAX_JSON_CHARS} characters as JSON; compile keys are far smaller")
    return value


BoundedJson = Annotated[Any, AfterValidator(_bounded)]


class ErrorBody(BaseModel):
    """Every error the service returns: one line saying what failed and how to fix it."""

    detail: str


class TokenSelf(BaseModel):
    """The request's own token (GET /v1/token)."""

    name: str
    scope: str = Field(examples=["publish"])
    skus: list[str] | None = Field(default=None, description="SKUs a publish token is limited to; null: all")


class Health(BaseModel):
    status: str = Field(examples=["ok"])
    db: str = Field(examples=["ok"])


def _known_host(name: str) -> str:
    """A host target fa4_aot/domain/hosts.py knows, or "" (entries built before host targets existed): host code
    for an unknown one was never generated."""
    if name and name not in hosts.TARGETS:
        raise ValueError(f"unknown host target {name!r}: known are {', '.join(hosts.TARGETS)} "
                         "(fa4_aot/domain/hosts.py)")
    return name


HostTargetName = Annotated[str, Field(pattern=r"^([a-z0-9][a-z0-9_.-]*)?$", max_length=32, examples=["x86-64-v3"]),
                           AfterValidator(_known_host)]


class SkuFacts(BaseModel):
    """A SKU's target facts: what is baked into its kernels."""

    model_config = ConfigDict(from_attributes=True)

    name: SkuName
    arch: str = Field(pattern=r"^sm_[0-9a-z]+$", max_length=32, examples=["sm_90a"])
    sm_count: int = Field(gt=0, lt=2**31)
    l2_bytes: int = Field(gt=0, lt=2**53)
    cuda_major: int = Field(gt=0, lt=1000)
    host: HostTargetName = ""


class SkuSummary(SkuFacts):
    kernels: int = Field(description="Kernels the service holds for this SKU (objects: a base-key signpost and "
                                     "the kernel it points at count once).")


class ManifestKernel(BaseModel):
    kernel_key: Hex64
    object_digest: Hex64
    size: int
    family: str


class Manifest(BaseModel):
    """Everything a client of one SKU may fetch, sorted by kernel key. Served with a strong ETag."""

    sku: SkuFacts
    kernels: list[ManifestKernel]


HostArch = Annotated[str, Field(pattern=r"^[a-z0-9_]+$", min_length=1, max_length=32, examples=["x86_64"])]
SoName = Annotated[str, Field(pattern=r"^lib[A-Za-z0-9_.+-]+\.so[0-9.]*$", max_length=128)]


class SharedLib(BaseModel):
    """A kernel linked for the lean runtime on one host arch: the library object, and the runtime libraries it
    needs by SONAME (an object digest, or "" for one the client finds itself, e.g. libtvm_ffi.so)."""

    model_config = ConfigDict(extra="forbid")

    digest: Hex64
    size: int = Field(ge=0, lt=2**53)
    needs: dict[SoName, Annotated[str, Field(pattern=r"^([0-9a-f]{64})?$")]] = Field(max_length=16)


class KernelIn(BaseModel):
    """An index entry to publish (fa4_aot.store.Entry's fields; `created` defaults to now)."""

    model_config = ConfigDict(extra="forbid")

    kernel_key: Hex64
    object_digest: Hex64
    size: int = Field(ge=0, lt=2**53)
    family: Text = Field(min_length=1, max_length=128)
    compile_key: BoundedJson
    sku: SkuName
    arch: str = Field(pattern=r"^sm_[0-9a-z]+$", max_length=32, examples=["sm_90a"])
    sm_count: int = Field(gt=0, lt=2**31)
    l2_bytes: int = Field(gt=0, lt=2**53)
    cuda_major: int = Field(gt=0, lt=1000)
    # the host target its host code was built for (fa4_aot/domain/hosts.py); part of the key, "" for older entries
    host: HostTargetName = ""
    toolchain: dict[str, str]
    variant: Text = Field(max_length=4096)
    call: Text = Field(max_length=65536)
    compile_seconds: float = Field(ge=0, allow_inf_nan=False)
    hardware_queries: Annotated[list[Any], AfterValidator(_bounded)] = Field(default_factory=list)
    # Not part of the kernel key; once published, a host arch's library is immutable (another arch may be added)
    shared_libs: dict[HostArch, SharedLib] = Field(default_factory=dict, max_length=8)
    created: Text | None = Field(default=None, max_length=40, examples=["2025-01-31T12:00:00Z"])


class KernelOut(KernelIn):
    created: str


class BundleIn(BaseModel):
    """Kernels to send in one response (POST /v1/bundles): what one node needs for a model, or a whole SKU."""

    model_config = ConfigDict(extra="forbid")

    kernel_keys: list[Hex64] = Field(min_length=1, max_length=4096)
    # a lean-runtime host's arch: its linked libraries and their runtime libraries come along too
    host_arch: HostArch | None = None


class RecipeOut(BaseModel):
    key: Hex64
    digest: Hex64
    size: int


class Recipes(BaseModel):
    """The lean runtime's recipe files of a SKU (of every SKU with its target facts), by recipe key."""

    recipes: list[RecipeOut]


class ObjectOut(BaseModel):
    digest: Hex64
    size: int


class CallIn(BaseModel):
    """A concrete FA4 call (fa4_aot.domain.calls.Call, its fields exactly): what `build --from-misses` builds."""

    model_config = ConfigDict(extra="forbid")

    layout: Literal["dense", "varlen", "seqused", "paged"]
    pass_: Literal["fwd", "fwd_lse", "bwd", "bwd_det"]
    dtype: Literal["bf16", "fp16"]
    head_dim: int = Field(gt=0, le=1024)
    head_dim_v: int = Field(gt=0, le=1024)
    mask: Literal["full", "causal", "local"]
    window: tuple[int, int]
    softcap: float = Field(allow_inf_nan=False)
    sink: bool
    num_splits: int = Field(ge=0, le=1 << 16)
    batch: int = Field(gt=0, lt=1 << 31)
    seqlen_q: int = Field(gt=0, lt=1 << 31)
    seqlen_k: int = Field(gt=0, lt=1 << 31)
    heads_q: int = Field(gt=0, le=1 << 16)
    heads_kv: int = Field(gt=0, le=1 << 16)
    page_size: int = Field(default=0, ge=0, lt=1 << 31)

    @model_validator(mode="after")
    def _in_fa4s_ranges(self) -> CallIn:
        """A call FA4 would refuse costs no compile: domain/call_ranges.py holds FA4's ranges."""
        call_ranges.check(self.call())
        return self

    def call(self) -> Call:
        return Call.from_dict(self.model_dump())


def _call_record(value: Any) -> Any:
    """A miss's `args`: None, or a record fa4_aot.domain.exact.check accepts (bounded: at most 16 KiB as JSON)."""
    return None if value is None else exact.check(check_depth(value))


class MissIn(BaseModel):
    """A kernel a client lacked (fa4_aot.domain.misses.Miss, with the same field names). Other top-level fields,
    such as the client's `when`, are ignored: the server's clock stamps first_seen and last_seen. `call`, when
    given, must be a whole Call; `args`, when given, a whole exact call record (fa4_aot.domain.exact). `to_miss`
    is the one conversion to the domain value the service's crud works with."""

    model_config = ConfigDict(extra="ignore")

    kernel_key: Hex64
    sku: SkuName
    family: Text = Field(min_length=1, max_length=128)
    compile_key: BoundedJson
    call: CallIn | None = Field(default=None, description="The call that needed it (fa4_aot.domain.calls.Call)")
    args: Annotated[dict[str, Any] | None, AfterValidator(_call_record)] = Field(
        default=None, description="The exact FA4 arguments of that call (fa4_aot.domain.exact): what build "
                                  "--from-misses replays")


    @model_validator(mode="after")
    def _small_and_keyed_by_its_call(self) -> MissIn:
        """A miss is stored twice (its row and its job's), so it holds no more than a real one needs; a lean miss
        (family "recipe") is keyed by its call, as the client computes it (misses.lean_key), and its compile
        key is that call: a key of one call carrying another would make the job of the first build the second."""
        if len(canonical_json(self.compile_key)) > MAX_MISS_KEY_CHARS:
            raise ValueError(f"compile_key is longer than {MAX_MISS_KEY_CHARS} characters as JSON; a real FA4 compile "
                             "key is under 2 KiB")
        if self.family != LEAN_FAMILY:
            return self
        if self.call is None or self.args is not None:
            raise ValueError(f"a lean miss (family {LEAN_FAMILY!r}) carries its call and no args, as "
                             "fa4_aot.domain.misses.Miss.lean makes it")
        call = self.call.call().to_dict()
        if canonical_json(self.compile_key) != canonical_json(call):
            raise ValueError(f"a lean miss's compile_key must be its call ({canonical_json(call)})")
        expected = lean_key(call, self.sku)
        if self.kernel_key != expected:
            raise ValueError(f"kernel_key {self.kernel_key} is not the key of this call on SKU {self.sku} "
                             f"({expected}, fa4_aot.domain.misses.lean_key): report the key of the call you send")
        return self

    def to_miss(self) -> Miss:
        """The domain value of this report; its call as the service checked and stores it (CallIn's fields), its
        `when` the server's (the client's is not trusted)."""
        return Miss(kernel_key=self.kernel_key, family=self.family, compile_key=self.compile_key, sku=self.sku,
                    call=None if self.call is None else self.call.model_dump(), args=self.args)


class MissOut(MissIn):
    count: int
    first_seen: datetime
    last_seen: datetime


class Envelope(BaseModel):
    """A signed SKU manifest (fa4_aot.trust.signing): `signature` is Ed25519 over the canonical JSON of `manifest`,
    which holds {"sku": {name, arch, sm_count, l2_bytes, cuda_major}, "kernels": {kernel_key: object_digest},
    "toolchain", "created", "expires"}. Its id is the sha256 of that canonical JSON."""

    model_config = ConfigDict(extra="allow")

    format: str = Field(examples=["fa4-aot-manifest/1"])
    manifest: dict[str, Any]
    key_id: str = Field(description="First 16 hex digits of the sha256 of the raw public key")
    public_key: str = Field(description="The raw 32-byte Ed25519 public key, base64")
    signature: str = Field(description="Ed25519 signature of the manifest's canonical JSON, base64")


class ManifestStored(BaseModel):
    """What PUT /v1/skus/{sku}/manifests stored (or already held)."""

    manifest_id: Hex64
    sku: SkuName
    key_id: str
    kernels: int = Field(description="Kernels the manifest lists")
    created: str
    expires: str


class SignedManifests(BaseModel):
    manifests: list[Envelope] = Field(description="Every stored envelope of the SKU, newest `created` first")


class RevocationIn(BaseModel):
    """Revoke a signing key (its 16 hex key id) or one manifest (its 64 hex manifest id)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["key", "manifest"]
    id: str = Field(max_length=64, description="16 lowercase hex for a key, 64 for a manifest")
    reason: Text = Field(default="", max_length=500)

    @model_validator(mode="after")
    def _id_matches_kind(self) -> RevocationIn:
        pattern, digits = (KEY_ID, 16) if self.kind == "key" else (HEX64, 64)
        if not re.fullmatch(pattern, self.id):
            raise ValueError(f"a {self.kind} id is {digits} lowercase hex digits, not {self.id!r}")
        return self


class RevocationOut(BaseModel):
    kind: Literal["key", "manifest"]
    id: str
    reason: str
    created: datetime


class Revocations(BaseModel):
    """Everything revoked: the ids by kind (what clients merge into their own list) and the full entries."""

    keys: list[str]
    manifests: list[str]
    entries: list[RevocationOut]


class AuditEntry(BaseModel):
    id: int = Field(description="Increasing; pass the last one seen as after_id to page on")
    at: datetime
    actor: str = Field(description="The acting token's name (#<id> when unnamed), or \"cli\"")
    action: str = Field(examples=["object.create", "kernel.create", "kernel.update", "manifest.store",
                                  "revocation.add", "token.create", "token.rotate", "token.revoke"])
    target: str
    detail: dict[str, Any]


class AuditLog(BaseModel):
    entries: list[AuditEntry]
