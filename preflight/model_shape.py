"""What a model folder says about its shape: layer types, head counts, experts, MTP tensors.

Read from `config.json` (flat text configs and multimodal ones with a nested `text_config`) and,
when present, `model.safetensors.index.json` or a single `model.safetensors` header. Placement
and the guard's `tp-divisibility` rule share `tensor_parallel_problems`, so they can never
disagree about which tensor-parallel sizes a model allows.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ModelShapeError(ValueError):
    """The model folder cannot be read as a model (missing or malformed config)."""


@dataclass(frozen=True)
class ModelShape:
    architectures: tuple[str, ...]
    model_type: str
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    linear_num_key_heads: int  # 0 for models without GDN layers
    linear_num_value_heads: int
    num_experts: int  # 0 for dense models
    mtp_num_hidden_layers: int
    # Tensor names from the weight index or safetensors header; None when no weights are described.
    tensor_names: tuple[str, ...] | None = field(default=None, repr=False)

    @property
    def gdn_layers(self) -> int:
        return sum(1 for kind in self.layer_types if kind == "linear_attention")

    @property
    def is_hybrid_gdn(self) -> bool:
        return self.gdn_layers > 0

    @property
    def mtp_tensor_count(self) -> int | None:
        if self.tensor_names is None:
            return None
        return sum(1 for name in self.tensor_names if name.startswith(("mtp.", "model.mtp.")))


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    nested = config.get("text_config")
    if isinstance(nested, dict):
        return {**{k: v for k, v in config.items() if k != "text_config"}, **nested}
    return config


def _int(config: dict[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if value is None:
        raise ModelShapeError(f"config.json has no `{key}`")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelShapeError(f"config.json `{key}` should be an integer, found {value!r}")
    return value


def _layer_types(config: dict[str, Any], layers: int) -> tuple[str, ...]:
    explicit = config.get("layer_types")
    if isinstance(explicit, list) and all(isinstance(k, str) for k in explicit):
        return tuple(explicit)
    interval = config.get("full_attention_interval")
    if isinstance(interval, int) and interval > 0 and "linear_num_value_heads" in config:
        return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers))
    return tuple("full_attention" for _ in range(layers))


def _safetensors_header_names(path: Path) -> tuple[str, ...]:
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    return tuple(sorted(name for name in header if name != "__metadata__"))


def read_tensor_names(model_dir: Path) -> tuple[str, ...] | None:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise ModelShapeError(f"{index} is not a safetensors index: {error}") from None
        return tuple(sorted(weight_map))
    single = model_dir / "model.safetensors"
    if single.is_file():
        try:
            return _safetensors_header_names(single)
        except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ModelShapeError(f"{single} has no readable safetensors header: {error}") from None
    return None


def shape_from_config(config: dict[str, Any], tensor_names: tuple[str, ...] | None = None) -> ModelShape:
    text = _text_config(config)
    layers = _int(text, "num_hidden_layers")
    heads = _int(text, "num_attention_heads")
    architectures = config.get("architectures") or []
    return ModelShape(
        architectures=tuple(str(a) for a in architectures),
        model_type=str(text.get("model_type", config.get("model_type", ""))),
        num_hidden_layers=layers,
        layer_types=_layer_types(text, layers),
        num_attention_heads=heads,
        num_key_value_heads=_int(text, "num_key_value_heads", heads),
        linear_num_key_heads=_int(text, "linear_num_key_heads", 0),
        linear_num_value_heads=_int(text, "linear_num_value_heads", 0),
        num_experts=_int(text, "num_experts", _int(text, "num_local_experts", 0)),
        mtp_num_hidden_layers=_int(text, "mtp_num_hidden_layers", 0),
        tensor_names=tensor_names,
    )


def read_model_shape(model_dir: Path) -> ModelShape:
    config_path = model_dir / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelShapeError(f"{model_dir} has no config.json") from None
    except json.JSONDecodeError as error:
        raise ModelShapeError(f"{config_path} is not valid JSON: {error}") from None
    if not isinstance(config, dict):
        raise ModelShapeError(f"{config_path} is not a JSON object")
    return shape_from_config(config, read_tensor_names(model_dir))


def tensor_parallel_problems(shape: ModelShape, tp: int) -> list[str]:
    """Why `tp` cannot shard this model, as the engine shards it; empty when it can.

    Attention query heads and GDN key/value heads are split across ranks and must divide evenly.
    KV heads are split when there are at least `tp` of them, and replicated otherwise, which
    needs `tp` to be a multiple of their count.
    """
    if tp < 1:
        return [f"tensor-parallel size must be at least 1, not {tp}"]
    problems: list[str] = []
    if shape.num_attention_heads % tp:
        problems.append(f"{shape.num_attention_heads} attention heads do not split over {tp} ranks")
    kv = shape.num_key_value_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        problems.append(f"{kv} KV heads can be neither split nor evenly replicated over {tp} ranks")
    if shape.linear_num_key_heads and shape.linear_num_key_heads % tp:
        problems.append(f"{shape.linear_num_key_heads} GDN key heads do not split over {tp} ranks")
    if shape.linear_num_value_heads and shape.linear_num_value_heads % tp:
        problems.append(f"{shape.linear_num_value_heads} GDN value heads do not split over {tp} ranks")
    return problems


def valid_tensor_parallel_sizes(shape: ModelShape, max_devices: int) -> list[int]:
    """Every tensor-parallel size from 1 to `max_devices` the model can be sharded with, ascending."""
    return [tp for tp in range(1, max_devices + 1) if not tensor_parallel_problems(shape, tp)]
