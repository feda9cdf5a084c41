"""The tiny model builder is deterministic and builds the real hybrid architecture."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from preflight.model_shape import read_model_shape, valid_tensor_parallel_sizes
from service.cli import main
from service.errors import UserError
from service.models.qwen36 import write_qwen36_config
from service.models.tiny import build_tiny_model


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def tiny_mtp_peaky(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("a") / "m", mtp=True, peaky=True, seed=0)


def test_same_seed_gives_byte_identical_files(tiny_mtp_peaky: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "m", mtp=True, peaky=True, seed=0)
    assert digests(again) == digests(tiny_mtp_peaky)


def test_other_seed_changes_weights_but_not_tokenizer(tiny_mtp_peaky: Path, tmp_path: Path) -> None:
    other = digests(build_tiny_model(tmp_path / "m", mtp=True, peaky=True, seed=1))
    base = digests(tiny_mtp_peaky)
    assert other["model.safetensors"] != base["model.safetensors"]
    assert other["tokenizer.json"] == base["tokenizer.json"]


def test_architecture_is_the_gdn_attention_moe_hybrid(tiny_mtp_peaky: Path) -> None:
    config = json.loads((tiny_mtp_peaky / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5MoeForCausalLM"]
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert config["num_experts"] == 4 and config["num_experts_per_tok"] == 2
    assert config["shared_expert_intermediate_size"] > 0
    # The CPU engine accepts only these GDN head dims and bf16.
    assert config["linear_key_head_dim"] in (64, 128) and config["linear_value_head_dim"] in (64, 128)
    assert config["dtype"] == "bfloat16"
    shape = read_model_shape(tiny_mtp_peaky)
    assert shape.is_hybrid_gdn and shape.gdn_layers == 3
    assert shape.mtp_num_hidden_layers == 1
    assert shape.mtp_tensor_count is not None and shape.mtp_tensor_count > 0


def test_peaky_model_ships_its_greedy_chain(tiny_mtp_peaky: Path) -> None:
    chain = json.loads((tiny_mtp_peaky / "perm.json").read_text())["next_token_of"]
    assert sorted(chain) == list(range(1024))  # a permutation of the vocabulary


def test_tokenizer_is_trained_locally_and_splits_text(tiny_mtp_peaky: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_mtp_peaky))
    ids = tokenizer("The supervisor checks that the engine generates real tokens.")["input_ids"]
    assert len(ids) > 5
    assert len(tokenizer) == 1024


def test_builder_never_overwrites(tiny_mtp_peaky: Path) -> None:
    with pytest.raises(UserError, match="not empty"):
        build_tiny_model(tiny_mtp_peaky)


def test_qwen36_config_has_the_real_dimensions(tmp_path: Path) -> None:
    write_qwen36_config(tmp_path, mtp_weights=False)
    shape = read_model_shape(tmp_path)
    assert shape.architectures == ("Qwen3_5MoeForConditionalGeneration",)
    assert shape.num_hidden_layers == 40 and shape.gdn_layers == 30
    assert [i for i, t in enumerate(shape.layer_types) if t == "full_attention"] == list(range(3, 40, 4))
    assert (shape.num_attention_heads, shape.num_key_value_heads) == (16, 2)
    assert (shape.linear_num_key_heads, shape.linear_num_value_heads) == (16, 32)
    assert shape.num_experts == 256
    assert shape.mtp_num_hidden_layers == 1 and shape.mtp_tensor_count == 0
    assert valid_tensor_parallel_sizes(shape, 8) == [1, 2, 4, 8]  # never 3


def test_qwen36_config_with_mtp_weights_lists_them(tmp_path: Path) -> None:
    write_qwen36_config(tmp_path, mtp_weights=True)
    count = read_model_shape(tmp_path).mtp_tensor_count
    assert count is not None and count > 256


def test_cli_model_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "config", "qwen36-35b-a3b", str(tmp_path / "q")]) == 0
    assert (tmp_path / "q" / "config.json").is_file()
    assert main(["model", "config", "qwen36-35b-a3b", str(tmp_path / "q")]) == 1
    assert "already exists" in capsys.readouterr().err


def test_mtp_noise_changes_only_the_mtp_layer(tiny_mtp_peaky: Path, tmp_path: Path) -> None:
    """The blurred MTP head is the same main model (a no-spec reference still holds); only mtp.* differ."""
    noisy = digests(build_tiny_model(tmp_path / "n", mtp=True, peaky=True, seed=0, mtp_noise=3.5))
    base = digests(tiny_mtp_peaky)
    assert noisy["model.safetensors"] == base["model.safetensors"]
    assert noisy["mtp.safetensors"] != base["mtp.safetensors"]
    with pytest.raises(UserError, match="--mtp-noise"):
        build_tiny_model(tmp_path / "x", peaky=True, mtp_noise=1.0)


def test_mtp_noise_must_be_a_number_at_least_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["model", "tiny", str(tmp_path / "m"), "--mtp", "--peaky", "--mtp-noise", "-1"])
    assert exited.value.code == 2
    assert "--mtp-noise" in capsys.readouterr().err and not (tmp_path / "m").exists()
