import json

from bench.hash_bench import GIB, MIB, MIN_SHARDS, json_files, shard_sizes


def test_shards_have_a_model_shape():
    sizes = shard_sizes(4 * GIB)
    assert sum(sizes) == 4 * GIB
    assert len(sizes) == 8
    assert all(500 * MIB < s < 600 * MIB for s in sizes[:-1])  # multi-hundred-MB
    assert abs(sizes[-1] - sizes[0] / 2) <= 1  # Hugging Face leaves a smaller last shard
    small = shard_sizes(GIB // 10)
    assert len(small) == MIN_SHARDS and sum(small) == GIB // 10


def test_index_names_every_shard():
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = json_files(names)["model.safetensors.index.json"]
    assert sorted(set(json.loads(index)["weight_map"].values())) == names
