"""A Hugging Face config.json read as attention facts (a facts.Model). Pure: no transformers, no torch.

Read, in order of precedence:
- heads: num_attention_heads (Falcon: n_head); KV heads: num_key_value_heads (Falcon: num_kv_heads / n_head_kv,
  multi_query = 1; GLM: multi_query_group_num), else MHA;
- head dims: MLA's qk_nope_head_dim + qk_rope_head_dim and v_head_dim (KV heads = query heads after
  up-projection), else head_dim, else hidden_size / heads; diffusers' attention_head_dim;
- windows: sliding_window with per-layer types from layer_types, sliding_window_pattern (Gemma 3: every Nth
  layer global), Gemma 2's alternation, use_sliding_window + max_window_layers (Qwen2); a sliding_window
  alone means every layer is local (Mistral);
- attn_logit_softcapping; sinks (GPT-OSS: model_type gpt_oss); torch_dtype (or dtype): float16 -> fp16, else bf16;
- encoders: BERT/ViT-like model types and diffusers transformers (_class_name) run full attention.
A multimodal config's text_config is read when the top level holds no attention heads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .facts import Model, make

ENCODER_TYPES = ("bert", "roberta", "xlm-roberta", "distilbert", "deberta", "deberta-v2", "electra", "vit", "deit",
                 "dinov2", "beit", "clip_vision_model", "siglip_vision_model", "modernbert")
SINK_TYPES = ("gpt_oss",)
ALTERNATING_TYPES = ("gemma2",)
MAX_CONFIG = 4 << 20  # bytes: a config.json is a few KiB (a multimodal one with its processor maps, some 100s)
MAX_DEPTH = 32  # levels of nesting: configs nest a few (text_config, rope_scaling...)
PATTERN_DEFAULTS = {"gemma3_text": 6}  # Gemma3TextConfig's default sliding_window_pattern (configs may omit it)


def load(path: Path) -> Model:
    """The model `path` (a config.json) describes. Raises ConfigError naming the file and what is missing, also
    for a file past MAX_CONFIG bytes (read no further: /dev/zero ends too), nested past MAX_DEPTH or holding NaN
    or an infinite number."""
    try:
        data = json.loads(_read(Path(path)), parse_constant=_not_finite, parse_float=_finite)
    except RecursionError:
        raise ConfigError(f"cannot read Hugging Face config {path}: nested too deeply to be one") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read Hugging Face config {path}: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config.json holds a JSON object")
    if _depth(data) > MAX_DEPTH:
        raise ConfigError(f"cannot read Hugging Face config {path}: nested deeper than {MAX_DEPTH} levels")
    try:
        return parse(data, name=_name(path, data), source=str(path))
    except (KeyError, ValueError, TypeError, ZeroDivisionError, OverflowError) as e:
        raise ConfigError(f"{path}: cannot derive attention facts: {e}; give a config.json with "
                          "num_attention_heads and head_dim or hidden_size") from e


def _read(path: Path) -> str:
    """The text of `path`, at most MAX_CONFIG bytes of it (ValueError past that)."""
    with open(path, "rb") as f:
        data = f.read(MAX_CONFIG + 1)
    if len(data) > MAX_CONFIG:
        raise ValueError(f"larger than {MAX_CONFIG >> 20} MiB, far more than a config.json holds")
    return data.decode()


def _not_finite(word: str) -> float:
    raise ValueError(f"{word} is not a number a config.json may hold")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} is too large for a number of a config.json")
    return value


def _depth(value: Any, level: int = 0) -> int:
    """How deep `value` nests (stops counting past MAX_DEPTH)."""
    if level > MAX_DEPTH or not isinstance(value, (dict, list)):
        return level
    items = value.values() if isinstance(value, dict) else value
    return max((_depth(v, level + 1) for v in items), default=level + 1)


def _name(path: Path, data: dict[str, Any]) -> str:
    """_name_or_path, else the file's stem, else (for .../NAME/config.json) its folder's name."""
    path = Path(path).resolve()
    name = data.get("_name_or_path") or (path.parent.name if path.name == "config.json" else path.stem)
    return str(name).rstrip("/").split("/")[-1]


def parse(data: dict[str, Any], name: str, source: str) -> Model:
    """Attention facts of an already-parsed config.json."""
    cfg = data
    if _heads(data) is None and isinstance(data.get("text_config"), dict):
        cfg = {**data["text_config"], "torch_dtype": data["text_config"].get("torch_dtype", data.get("torch_dtype"))}
    heads = _heads(cfg)
    if heads is None:
        raise KeyError("num_attention_heads")
    kind = "encoder" if _is_encoder(cfg) else "decoder"
    d, dv, kv = _dims(cfg, heads)
    layers, window, pattern = _layers(cfg) if kind == "decoder" else ("global", 0, "")
    return make(name=name, source=source, kind=kind, heads=heads, kv_heads=kv, head_dim=d, head_dim_v=dv,
                dtype=_dtype(cfg), window=window, layers=layers, pattern=pattern,
                softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
                sink=cfg.get("model_type") in SINK_TYPES)


def _heads(cfg: dict[str, Any]) -> int | None:
    value = cfg.get("num_attention_heads", cfg.get("n_head"))
    return int(value) if value else None


def _is_encoder(cfg: dict[str, Any]) -> bool:
    return cfg.get("model_type") in ENCODER_TYPES or "_class_name" in cfg


def _dims(cfg: dict[str, Any], heads: int) -> tuple[int, int, int]:
    """(qk head dim, v head dim, KV heads)."""
    if cfg.get("qk_nope_head_dim") is not None and cfg.get("v_head_dim") is not None:  # MLA, after up-projection
        return int(cfg["qk_nope_head_dim"]) + int(cfg.get("qk_rope_head_dim") or 0), int(cfg["v_head_dim"]), heads
    d = cfg.get("head_dim") or cfg.get("attention_head_dim") or cfg.get("kv_channels")
    if not d:
        d = int(cfg.get("hidden_size", cfg.get("d_model", 0))) // heads
    return int(d), int(d), _kv_heads(cfg, heads)


def _kv_heads(cfg: dict[str, Any], heads: int) -> int:
    for key in ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"):
        if cfg.get(key):
            return int(cfg[key])
    if cfg.get("multi_query"):
        return 1
    return heads


def _layers(cfg: dict[str, Any]) -> tuple[str, int, str]:
    """(layers, window, pattern) in models.Model's terms."""
    window = int(cfg.get("sliding_window") or 0)
    if not window or cfg.get("use_sliding_window") is False:
        return "global", 0, ""
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        local = sum("sliding" in str(t) for t in types)
        if local == 0:
            return "global", 0, ""
        kind = "local" if local == len(types) else "mixed"
        return kind, window, f"{local} local / {len(types) - local} global layers (layer_types)"
    every = cfg.get("sliding_window_pattern", PATTERN_DEFAULTS.get(cfg.get("model_type", "")))
    if isinstance(every, int) and every > 1:
        return "mixed", window, f"{every - 1} local : 1 global (sliding_window_pattern)"
    if cfg.get("model_type") in ALTERNATING_TYPES:
        return "mixed", window, "alternating local/global"
    first_local = cfg.get("max_window_layers")  # Qwen2: layers from this index on use the window
    if isinstance(first_local, int) and first_local > 0:
        if first_local >= int(cfg.get("num_hidden_layers", first_local)):
            return "global", 0, ""
        return "mixed", window, f"local from layer {first_local} on (max_window_layers)"
    return "local", window, ""


def _dtype(cfg: dict[str, Any]) -> str:
    value = str(cfg.get("torch_dtype") or cfg.get("dtype") or "")
    return "fp16" if value in ("float16", "torch.float16", "half") else "bf16"
