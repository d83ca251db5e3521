"""model_check: what vLLM needs from a local model directory, and engine-run's refusal."""

import json
import sys
import textwrap
from pathlib import Path

import pytest

from tests.unit.conftest import make_model
from vllm_fleet import cli
from vllm_fleet.engine import exec as engine_exec
from vllm_fleet.engine.config import EngineConfig
from vllm_fleet.engine.model_check import check_model, missing_files
from vllm_fleet.weights.base import MANIFEST_NAME
from vllm_fleet.weights.manifest import build_manifest, canonical_json


def sharded(path: Path, shards: int = 3, index: str = "model.safetensors.index.json") -> Path:
    """A model in three safetensors shards with its index (two tensors per shard)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "llama"}')
    (path / "tokenizer.json").write_text('{"version": "1.0"}')
    ext = "bin" if index.startswith("pytorch") else "safetensors"
    stem = "pytorch_model" if ext == "bin" else "model"
    weight_map = {}
    for i in range(1, shards + 1):
        name = f"{stem}-{i:05d}-of-{shards:05d}.{ext}"
        (path / name).write_bytes(b"\x01" * 100)
        weight_map |= {f"layers.{i}.q": name, f"layers.{i}.k": name}
    (path / index).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def test_complete_single_file_model(tmp_path):
    assert missing_files(make_model(tmp_path / "m")) == []


def test_complete_sharded_model(tmp_path):
    assert missing_files(sharded(tmp_path / "m")) == []


def test_missing_shard_is_named_with_the_index_that_lists_it(tmp_path):
    model = sharded(tmp_path / "m")
    (model / "model-00002-of-00003.safetensors").unlink()
    assert missing_files(model) == [
        "model.safetensors.index.json lists model-00002-of-00003.safetensors, which is missing"
    ]


def test_empty_shard(tmp_path):
    model = sharded(tmp_path / "m", index="pytorch_model.bin.index.json")
    (model / "pytorch_model-00003-of-00003.bin").write_bytes(b"")
    assert missing_files(model) == [
        "pytorch_model.bin.index.json lists pytorch_model-00003-of-00003.bin, which is empty"
    ]


def test_safetensors_index_wins_over_a_bin_index_for_files_never_loaded(tmp_path):
    model = sharded(tmp_path / "m")
    (model / "pytorch_model.bin.index.json").write_text(
        json.dumps({"weight_map": {"x": "pytorch_model-00001-of-00002.bin"}})
    )
    assert missing_files(model) == []


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("{not json", "is not valid JSON"),
        ('{"metadata": {}}', "has no weight_map of tensor names to files"),
        ('{"weight_map": {}}', "lists no weight files"),
    ],
)
def test_broken_index(tmp_path, content, why):
    model = sharded(tmp_path / "m")
    (model / "model.safetensors.index.json").write_text(content)
    [message] = missing_files(model)
    assert message.startswith(f"model.safetensors.index.json {why}")


def test_unindexed_shards_must_all_be_there(tmp_path):
    model = sharded(tmp_path / "m")
    (model / "model.safetensors.index.json").unlink()
    assert missing_files(model) == []
    (model / "model-00003-of-00003.safetensors").unlink()
    assert missing_files(model) == [
        "shard names like model-00001-of-00003.safetensors imply "
        "model-00003-of-00003.safetensors, which is missing"
    ]


def test_no_weights_at_all(tmp_path):
    model = make_model(tmp_path / "m")
    (model / "model.safetensors").unlink()
    [message] = missing_files(model)
    assert message.startswith("no weights: neither an index")


def test_empty_single_weights_file(tmp_path):
    model = make_model(tmp_path / "m", weights=b"")
    assert missing_files(model) == ["model.safetensors is empty"]


def test_missing_config_json(tmp_path):
    model = make_model(tmp_path / "m")
    (model / "config.json").unlink()
    assert missing_files(model) == ["config.json is missing"]


@pytest.mark.parametrize(
    ("content", "why"),
    [("", "is not valid JSON"), ('{"model_type": ', "is not valid JSON"), ("[1]", "is not a JSON")],
)
def test_bad_config_json(tmp_path, content, why):
    model = make_model(tmp_path / "m")
    (model / "config.json").write_text(content)
    [message] = missing_files(model)
    assert message.startswith(f"config.json {why}")


@pytest.mark.parametrize(
    "files",
    [
        {"tokenizer.json": "{}"},
        {"tokenizer.model": "\x0a\x0bsentencepiece"},
        {"vocab.json": "{}", "merges.txt": "#version: 0.2\n"},
        {"vocab.txt": "[PAD]\n"},
    ],
    ids=["fast", "sentencepiece", "bpe", "wordpiece"],
)
def test_tokenizer_forms_that_transformers_loads(tmp_path, files):
    model = make_model(tmp_path / "m")
    (model / "tokenizer.json").unlink()
    for name, content in files.items():
        (model / name).write_text(content)
    assert missing_files(model) == []


def test_no_tokenizer(tmp_path):
    model = make_model(tmp_path / "m")
    (model / "tokenizer.json").unlink()
    (model / "tokenizer_config.json").write_text('{"tokenizer_class": "LlamaTokenizer"}')
    [message] = missing_files(model)
    assert message.startswith("no tokenizer: none of tokenizer.json, tokenizer.model")


def test_half_a_bpe_tokenizer_names_the_missing_half(tmp_path):
    model = make_model(tmp_path / "m")
    (model / "tokenizer.json").unlink()
    (model / "vocab.json").write_text("{}")
    assert missing_files(model) == [
        "vocab.json is present but merges.txt, which BPE needs, is missing"
    ]


def test_empty_tokenizer_file(tmp_path):
    model = make_model(tmp_path / "m")
    (model / "tokenizer.json").write_text("")
    assert missing_files(model) == ["tokenizer.json is empty"]


def test_present_optional_json_must_parse(tmp_path):
    model = make_model(tmp_path / "m")
    (model / "generation_config.json").write_text('{"eos_token_id": ')
    (model / "tokenizer_config.json").write_text("")
    messages = missing_files(model)
    assert [m.split(" is ")[0] for m in messages] == [
        "generation_config.json",
        "tokenizer_config.json",
    ]


def with_manifest(model: Path) -> Path:
    (model / MANIFEST_NAME).write_bytes(
        canonical_json(build_manifest("m", model, workers=2).model_dump())
    )
    return model


def test_manifest_listed_file_must_exist_with_its_size(tmp_path):
    model = with_manifest(make_model(tmp_path / "m"))
    (model / "generation_config.json").write_text("{}")  # not listed: fine
    assert missing_files(model) == []
    (model / "sub" / "extra.txt").unlink()
    (model / "model.safetensors").write_bytes(b"\x01" * 10)
    assert missing_files(model) == [
        f"{MANIFEST_NAME} lists model.safetensors with 300000 bytes; it has 10",
        f"{MANIFEST_NAME} lists sub/extra.txt, which is missing",
    ]


def test_a_file_missing_for_two_reasons_is_named_once(tmp_path):
    model = with_manifest(sharded(tmp_path / "m"))
    (model / "model-00001-of-00003.safetensors").unlink()
    assert [p.file for p in check_model(model)] == ["model-00001-of-00003.safetensors"]


def test_missing_directory(tmp_path):
    assert missing_files(tmp_path / "nope") == ["the model directory does not exist"]


def test_model_check_command(tmp_path, capsys):
    model = sharded(tmp_path / "m")
    assert cli.main(["model-check", str(model)]) == 0
    assert capsys.readouterr().out == f"{model}: complete\n"
    (model / "model-00001-of-00003.safetensors").unlink()
    assert cli.main(["model-check", str(model)]) == 1
    assert "model-00001-of-00003.safetensors, which is missing" in capsys.readouterr().out


# engine-run: the decision, and that run() stops before vLLM is started.

MARKER_VLLM = textwrap.dedent(
    """\
    #!{python}
    import pathlib, sys
    pathlib.Path(sys.argv[0]).with_name("started").write_text("vLLM was started")
    """
)


def engine_cfg(tmp_path: Path, model: Path, extra_args: list[str] | None = None) -> EngineConfig:
    stack = tmp_path / "stack"
    (stack / "bin").mkdir(parents=True, exist_ok=True)
    vllm = stack / "bin" / "vllm"
    vllm.write_text(MARKER_VLLM.format(python=sys.executable))
    vllm.chmod(0o755)
    return EngineConfig(
        group="g0",
        accelerator="cpu",
        stack="s",
        stack_dir=stack,
        model_path=model,
        served_name="m",
        port=8100,
        devices=[0],
        max_model_len=128,
        max_num_seqs=2,
        kv_cache_bytes=1 << 20,
        extra_args=extra_args or [],
    )


def test_engine_run_refuses_an_incomplete_model_before_starting_vllm(tmp_path, capsys):
    model = sharded(tmp_path / "m")
    (model / "model-00002-of-00003.safetensors").unlink()
    cfg = engine_cfg(tmp_path, model)
    config = tmp_path / "g0.json"
    config.write_text(cfg.model_dump_json())
    assert engine_exec.run(config) == engine_exec.MODEL_INCOMPLETE_EXIT != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1  # one journal line
    assert err == (
        f"engine-run: refusing to start vLLM: model {model} is incomplete: "
        "model.safetensors.index.json lists model-00002-of-00003.safetensors, which is missing "
        "(re-run the model_weights role, or `vllm-fleet model-check` the directory)\n"
    )
    assert not (tmp_path / "stack" / "bin" / "started").exists()


def test_complete_model_is_not_refused(tmp_path):
    assert engine_exec.model_refusal(engine_cfg(tmp_path, sharded(tmp_path / "m"))) is None


def test_many_problems_stay_one_short_line(tmp_path):
    model = sharded(tmp_path / "m", shards=9)
    for shard in model.glob("model-*.safetensors"):
        shard.unlink()
    refusal = engine_exec.model_refusal(engine_cfg(tmp_path, model))
    assert refusal is not None
    assert refusal.count("which is missing") == engine_exec.MAX_PROBLEMS_LOGGED
    assert "; and 4 more (re-run" in refusal


@pytest.mark.parametrize(
    ("extra_args", "refused"),
    [
        ([], True),
        (["--skip-tokenizer-init"], False),
        (["--tokenizer", "org/tokenizer-on-the-hub"], False),
        (["--tokenizer=TOKDIR"], False),
        (["--tokenizer", "/nonexistent/tokenizer"], True),
    ],
)
def test_tokenizer_options_of_vllm_are_followed(tmp_path, extra_args, refused):
    model = make_model(tmp_path / "m")
    (model / "tokenizer.json").unlink()
    tokdir = make_model(tmp_path / "tok")
    args = [a.replace("TOKDIR", str(tokdir)) for a in extra_args]
    refusal = engine_exec.model_refusal(engine_cfg(tmp_path, model, args))
    assert (refusal is not None) == refused
