"""An independent GGUF writer on numpy, written from the GGUF specification (ggml's docs/gguf.md) and
llama.cpp's `dream` naming, to check that the engine reads files it did not write itself.

File layout (version 3, little-endian):
    "GGUF", u32 version, u64 tensor_count, u64 metadata_kv_count
    metadata: string key (u64 length + UTF-8 bytes), u32 value type, value
              (types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array, 10 u64,
               11 i64, 12 f64; an array is u32 element type, u64 count, elements)
    tensor infos: string name, u32 n_dims, u64 dims[n_dims] (innermost first, i.e. reversed numpy
              shape), u32 ggml type (0 F32, 1 F16, 30 BF16), u64 offset into the data section (aligned)
    padding to general.alignment (32 unless the key says otherwise), then the data section.

Usage: gguf_np.py --model DIR --out FILE.gguf --type f32|f16|bf16 (norms and biases stay F32), or
gguf_np.py --fixtures DIR --out-dir DIR2: the files test_gguf reads (ctest gguf_np_fixtures). This
writer uses alignment 64 (written as general.alignment) and puts the metadata in another order than
the C++ writer, so the reader's alignment handling and key lookup are exercised too.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402

ALIGN = 64
GGML = {"f32": 0, "f16": 1, "bf16": 30}

LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}


def gguf_name(name):
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    parts = name.split(".", 3)  # model, layers, N, rest
    return "blk.%s.%s" % (parts[2], LAYER_NAMES[parts[3]])


def string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return string(key) + struct.pack("<I", vtype) + payload


def read_checkpoint(directory):
    index = os.path.join(directory, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    tensors = {}
    for f in files:
        t, _ = safetensors_np.read_file(os.path.join(directory, f), raw_bf16=True)
        tensors.update(t)
    return tensors


def encode(value, ggml_type):
    """The little-endian bytes of a tensor (numpy array or safetensors_np.BF16) as F32 / F16 / BF16."""
    if isinstance(value, safetensors_np.BF16):
        f32 = safetensors_np.bf16_bits_to_f32(value.bits)
        bits = value.bits
    else:
        f32 = np.asarray(value, dtype=np.float32)
        bits = None
    if ggml_type == 0:
        return np.ascontiguousarray(f32, dtype="<f4").tobytes()
    if ggml_type == 1:
        return np.ascontiguousarray(f32.astype("<f2")).tobytes()
    if bits is None:
        bits = safetensors_np.f32_to_bf16_bits(f32)
    return np.ascontiguousarray(bits, dtype="<u2").tobytes()


# (fixture, type) of the files test_gguf compares with the checkpoint directories.
TEST_FILES = [("tiny-gqa1", "f32"), ("tiny-gqa1", "f16"), ("tiny-gqa2", "f32"), ("tiny-gqa4-bf16", "bf16")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--out")
    ap.add_argument("--type", choices=sorted(GGML))
    ap.add_argument("--fixtures")
    ap.add_argument("--out-dir")
    a = ap.parse_args()
    if a.fixtures:
        os.makedirs(a.out_dir, exist_ok=True)
        for name, t in TEST_FILES:
            write_gguf(os.path.join(a.fixtures, name), os.path.join(a.out_dir, "%s.%s.gguf" % (name, t)), t)
    elif a.model and a.out and a.type:
        write_gguf(a.model, a.out, a.type)
    else:
        ap.error("give --model, --out and --type, or --fixtures and --out-dir")


def write_gguf(model, out, type_name):
    cfg = json.load(open(os.path.join(model, "config.json")))
    tensors = read_checkpoint(model)

    meta = [
        kv("general.alignment", 4, struct.pack("<I", ALIGN)),
        kv("dream.block_count", 4, struct.pack("<I", cfg["num_hidden_layers"])),
        kv("dream.embedding_length", 5, struct.pack("<i", cfg["hidden_size"])),  # int32: any integer type reads
        kv("dream.feed_forward_length", 10, struct.pack("<Q", cfg["intermediate_size"])),
        kv("dream.attention.head_count", 4, struct.pack("<I", cfg["num_attention_heads"])),
        kv("dream.attention.head_count_kv", 4, struct.pack("<I", cfg["num_key_value_heads"])),
        kv("dream.context_length", 4, struct.pack("<I", cfg["max_position_embeddings"])),
        kv("dream.rope.freq_base", 12, struct.pack("<d", cfg["rope_theta"])),  # f64 reads too
        kv("dream.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", cfg["rms_norm_eps"])),
        kv("dream.attention.causal", 7, struct.pack("<B", 0)),
        kv("tokenizer.ggml.mask_token_id", 4, struct.pack("<I", cfg["mask_token_id"])),
        kv("tokenizer.ggml.padding_token_id", 4, struct.pack("<I", cfg["pad_token_id"])),
        kv("general.architecture", 8, string("dream")),
    ]
    if "head_dim" in cfg and cfg["head_dim"] * cfg["num_attention_heads"] != cfg["hidden_size"]:
        meta.append(kv("dream.attention.key_length", 4, struct.pack("<I", cfg["head_dim"])))

    infos, blobs, offset = [], [], 0
    for name in sorted(tensors):  # another order than the engine's writer
        value = tensors[name]
        shape = value.bits.shape if isinstance(value, safetensors_np.BF16) else value.shape
        ggml_type = GGML[type_name] if len(shape) == 2 else 0
        data = encode(value, ggml_type)
        infos.append(string(gguf_name(name)) + struct.pack("<I", len(shape)) +
                     b"".join(struct.pack("<Q", d) for d in reversed(shape)) + struct.pack("<IQ", ggml_type, offset))
        pad = (-len(data)) % ALIGN
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad

    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(meta)) + b"".join(meta) + b"".join(infos)
    head += b"\0" * ((-len(head)) % ALIGN)
    safetensors_np.atomic_write_bytes(out, [head] + blobs)


if __name__ == "__main__":
    main()
