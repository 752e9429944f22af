#!/usr/bin/env python3
"""Reference data for lathe's safetensors reader and writer.

  tools/safetensors_fixtures.py make
      Writes, with the real `safetensors` library (and huggingface_hub's
      sharding, as transformers' save_pretrained uses it):
        tests/data/safetensors/py_mixed.safetensors   one file, mixed dtypes
        tests/data/safetensors/py_sharded/            3 shards + index.json
      and, beside each, <name>.expected.json: the tensors as Python reads
      them back (safetensors dtype, shape, values), which the C++ test compares against.

  tools/safetensors_fixtures.py read PATH
      Prints PATH (a .safetensors file, or a model directory with
      model.safetensors or model.safetensors.index.json) as that JSON, read
      by the Python library; exits non-zero if the directory layout is not
      what transformers expects. safetensors_test runs this on files lathe
      wrote.
"""
import json
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "data", "safetensors")


NUMPY_TYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
               "I8": "i1", "U8": "u1", "BOOL": "u1"}


def values_of(dtype, data):
    """A tensor's elements as Python numbers (floats exactly, via float64)."""
    import numpy as np

    if dtype == "BF16":  # numpy has no bfloat16: widen the bit pattern
        bits = np.frombuffer(bytes(data), dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64).tolist()
    arr = np.frombuffer(bytes(data), dtype=NUMPY_TYPES[dtype])
    return arr.astype(np.float64 if arr.dtype.kind == "f" else np.int64).tolist()


def describe_file(path, into):
    """Reads path with the safetensors library itself (no framework needed)."""
    from safetensors import deserialize, safe_open

    with open(path, "rb") as f:
        tensors = deserialize(f.read())
    for name, t in tensors:
        into[name] = {
            "dtype": t["dtype"],
            "shape": list(t["shape"]),
            "values": values_of(t["dtype"], t["data"]),
            "file": os.path.basename(path),
        }
    with safe_open(path, framework="numpy") as f:
        return f.metadata() or {}


def describe(path):
    out = {"tensors": {}}
    if os.path.isfile(path):
        out["metadata"] = describe_file(path, out["tensors"])
        return out
    index = os.path.join(path, "model.safetensors.index.json")
    if not os.path.exists(index):
        out["metadata"] = describe_file(os.path.join(path, "model.safetensors"), out["tensors"])
        return out
    with open(index) as f:
        idx = json.load(f)
    files = sorted(set(idx["weight_map"].values()))
    for fn in files:
        meta = describe_file(os.path.join(path, fn), out["tensors"])
        if meta.get("format") != "pt":
            sys.exit(f"{fn}: metadata format is {meta.get('format')!r}, transformers wants 'pt'")
    for name, fn in idx["weight_map"].items():
        if out["tensors"].get(name, {}).get("file") != fn:
            sys.exit(f"index maps {name} to {fn}, which does not hold it")
    if len(out["tensors"]) != len(idx["weight_map"]):
        sys.exit("shards hold tensors the index does not list")
    from safetensors import deserialize

    total = 0
    for fn in files:
        with open(os.path.join(path, fn), "rb") as f:
            total += sum(len(t["data"]) for _, t in deserialize(f.read()))
    if idx["metadata"]["total_size"] != total:
        sys.exit(f"index total_size {idx['metadata']['total_size']} != {total}")
    out["metadata"] = idx["metadata"]
    out["files"] = files
    return out


def make():
    import torch
    from huggingface_hub import save_torch_state_dict
    from safetensors.torch import save_file

    os.makedirs(OUT, exist_ok=True)
    g = torch.Generator().manual_seed(1234)
    tensors = {
        "model.embed_tokens.weight": torch.randn(5, 4, generator=g).to(torch.bfloat16),
        "model.norm.weight": torch.randn(4, generator=g).to(torch.float16),
        "lm_head.weight": torch.randn(3, 4, generator=g),
        "positions": torch.arange(-3, 3, dtype=torch.int64),
        "mask": torch.tensor([1, 0, 1], dtype=torch.bool),
        "bytes": torch.tensor([0, 7, 255], dtype=torch.uint8),
        "empty": torch.zeros(0, 3),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
    }
    path = os.path.join(OUT, "py_mixed.safetensors")
    save_file(tensors, path, metadata={"format": "pt", "note": "made by tools/safetensors_fixtures.py"})
    with open(path + ".expected.json", "w") as f:
        json.dump(describe(path), f, indent=1, sort_keys=True)

    sharded = {f"model.layers.{i}.mlp.weight": torch.randn(4, 8, generator=g).to(torch.bfloat16) for i in range(5)}
    d = os.path.join(OUT, "py_sharded")
    os.makedirs(d, exist_ok=True)
    save_torch_state_dict(sharded, d, max_shard_size=150)  # 64 bytes each: 2 + 2 + 1
    with open(os.path.join(OUT, "py_sharded.expected.json"), "w") as f:
        json.dump(describe(d), f, indent=1, sort_keys=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["make"]:
        make()
    elif sys.argv[1:2] == ["read"] and len(sys.argv) == 3:
        json.dump(describe(sys.argv[2]), sys.stdout, sort_keys=True)
    else:
        sys.exit(__doc__)
