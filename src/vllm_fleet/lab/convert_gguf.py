"""Convert the lab model (a GGUF file) into Hugging Face safetensors.

Run with a Python that has torch, transformers, gguf and accelerate (the lab's
conversion venv); it imports nothing from vllm_fleet so it can run there alone.
Usage: python convert_gguf.py GGUF_FILE OUT_DIR DTYPE
"""

from __future__ import annotations

import sys
from pathlib import Path


def convert(gguf_file: Path, out_dir: Path, dtype_name: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    dtype = getattr(torch, dtype_name)
    # Dense weights: vLLM loads plain safetensors, not GGUF blocks.
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_file.parent),
        gguf_file=gguf_file.name,
        dtype=dtype,
        quantization_config=GgufConfig(dequantize=True),
    )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    # save_pretrained refuses while the GGUF quantization config is attached.
    for holder in (model.config, getattr(model, "generation_config", None)):
        if holder is not None and hasattr(holder, "quantization_config"):
            delattr(holder, "quantization_config")
    model.config.dtype = dtype
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    convert(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
