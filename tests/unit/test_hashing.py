import hashlib

from vllm_fleet.weights.hashing import BLOCK_SIZE, sha256_files


def test_sha256_files_matches_hashlib_in_input_order_with_progress(tmp_path):
    sizes = {"small.json": 10, "empty": 0, "big.bin": 2 * BLOCK_SIZE + 123, "mid.bin": BLOCK_SIZE}
    paths = []
    for name, size in sizes.items():
        path = tmp_path / name
        path.write_bytes(bytes(i % 251 for i in range(size)))
        paths.append(path)
    done = []
    digests = sha256_files([*paths, paths[0]], workers=3, progress=done.append)
    # Hashed largest first, but returned keyed in the caller's order; a repeat is hashed once.
    assert list(digests) == paths
    assert digests == {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
    assert sum(done) == sum(sizes.values())
