#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes the malformed-checkpoint corpus (corpus/) and the fuzz seeds (seeds/) for
tests/model. Each corpus case is a small model directory that `dsquant inspect` must
refuse; MANIFEST lists, per case, the file and the detail (tensor or field) that its
error message must name. Deterministic: rerunning it rewrites the same bytes.

    python3 tests/model/mkcorpus.py [OUTDIR]   (default: the directory of this script)
"""
import json
import os
import shutil
import struct
import sys

SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
         "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def fill(dtype, shape, seed):
    """Deterministic small values: fp16 in [-1, 1), or plain bytes for integer types."""
    n = numel(shape)
    if dtype == "F16":
        return b"".join(struct.pack("<e", ((i * 37 + seed * 11) % 64 - 32) / 32.0)
                        for i in range(n))
    return bytes((i * 7 + seed) & 0xFF for i in range(n * SIZES[dtype]))


def st_bytes(tensors, metadata=None, header=None, pad=True, extra=b""):
    """tensors: list of (name, dtype, shape, data); written contiguously in that order.
    header: a dict to dump instead (offsets are then whatever it says)."""
    if header is None:
        header = {}
        if metadata is not None:
            header["__metadata__"] = metadata
        at = 0
        for name, dtype, shape, data in tensors:
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(data)]}
            at += len(data)
    text = header if isinstance(header, (bytes, str)) else json.dumps(header, separators=(",", ":"))
    if isinstance(text, str):
        text = text.encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors) + extra


# --- The tiny models the cases start from

def dense_config(**over):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4,
         "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 2, "vocab_size": 4,
         "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "hidden_act": "silu",
         "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
         "rope_theta": 10000.0, "rope_scaling": None}
    c.update(over)
    return c


def dense_tensors(h=4, i=8, kv=2, q=4, vocab=4, layers=1):
    t = [("model.embed_tokens.weight", "F16", [vocab, h])]
    for l in range(layers):
        p = f"model.layers.{l}."
        t += [(p + "input_layernorm.weight", "F16", [h]),
              (p + "self_attn.q_proj.weight", "F16", [q, h]),
              (p + "self_attn.k_proj.weight", "F16", [kv, h]),
              (p + "self_attn.v_proj.weight", "F16", [kv, h]),
              (p + "self_attn.o_proj.weight", "F16", [h, q]),
              (p + "post_attention_layernorm.weight", "F16", [h]),
              (p + "mlp.gate_proj.weight", "F16", [i, h]),
              (p + "mlp.up_proj.weight", "F16", [i, h]),
              (p + "mlp.down_proj.weight", "F16", [h, i])]
    t += [("model.norm.weight", "F16", [h]), ("lm_head.weight", "F16", [vocab, h])]
    return [(n, d, s, fill(d, s, k)) for k, (n, d, s) in enumerate(t)]


AWQ_QC = {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True,
          "version": "gemm", "modules_to_not_convert": None}


def awq_config(**over):
    c = dense_config(hidden_size=32, intermediate_size=32, head_dim=16, vocab_size=4,
                     quantization_config=dict(AWQ_QC))
    c.update(over)
    return c


def awq_tensors(h=32, i=32, kv=16, q=32, vocab=4, gs=32):
    def lin(name, n_in, n_out):
        return [(name + ".qweight", "I32", [n_in, n_out // 8]),
                (name + ".qzeros", "I32", [n_in // gs, n_out // 8]),
                (name + ".scales", "F16", [n_in // gs, n_out])]
    p = "model.layers.0."
    t = [("model.embed_tokens.weight", "F16", [vocab, h]),
         (p + "input_layernorm.weight", "F16", [h])]
    t += lin(p + "self_attn.q_proj", h, q) + lin(p + "self_attn.k_proj", h, kv)
    t += lin(p + "self_attn.v_proj", h, kv) + lin(p + "self_attn.o_proj", q, h)
    t += [(p + "post_attention_layernorm.weight", "F16", [h])]
    t += lin(p + "mlp.gate_proj", h, i) + lin(p + "mlp.up_proj", h, i)
    t += lin(p + "mlp.down_proj", i, h)
    t += [("model.norm.weight", "F16", [h]), ("lm_head.weight", "F16", [vocab, h])]
    return [(n, d, s, fill(d, s, k)) for k, (n, d, s) in enumerate(t)]


def header_of(tensors, metadata={"format": "pt"}):
    h = {"__metadata__": metadata} if metadata is not None else {}
    at = 0
    for name, dtype, shape, data in tensors:
        h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(data)]}
        at += len(data)
    return h


def replace(tensors, name, **kw):
    out = []
    for n, d, s, data in tensors:
        if n == name:
            d, s = kw.get("dtype", d), kw.get("shape", s)
            data = fill(d, s, 99)
        out.append((n, d, s, data))
    return out


# --- Cases: (name, files {relpath: bytes|dict}, file the message names, detail)

Q = "model.layers.0.self_attn.q_proj.weight"
K = "model.layers.0.self_attn.k_proj.weight"
UP = "model.layers.0.mlp.up_proj.weight"


def cases():
    T = dense_tensors()
    H = header_of(T)
    data = b"".join(t[3] for t in T)
    out = []

    def st_case(name, blob, detail, config=None):
        out.append((name, {"config.json": config or dense_config(), "model.safetensors": blob},
                    "model.safetensors", detail))

    def hdr_case(name, mutate, detail, extra=b""):
        h = json.loads(json.dumps(H))
        mutate(h)
        st_case(name, st_bytes(T, header=h, extra=extra), detail)

    # safetensors framing
    st_case("st-truncated", b"\x10\x00\x00\x00\x00", "too short")
    st_case("st-header-past-end", struct.pack("<Q", 4096) + b"{}", "runs past the end")
    st_case("st-header-over-limit", struct.pack("<Q", 200_000_000) + b"{}" + b" " * 6,
            "over the limit")
    st_case("st-invalid-json", st_bytes([], header=b'{"a": {"dtype": '), "not valid JSON")
    st_case("st-not-object", st_bytes([], header=b"[1, 2, 3]"), "not a JSON object")
    st_case("st-trailing-garbage", st_bytes([], header=b"{} xyz"), "trailing bytes")
    st_case("st-nul-in-header", st_bytes([], header=b'{"a\x00":1}'), "NUL")
    st_case("st-bad-utf8", st_bytes([], header=b'{"\xc3\x28": 1}'), "UTF-8")
    st_case("st-entry-not-object", st_bytes([], header=b'{"x": 5}'), "tensor 'x'")
    st_case("st-truncated-data", st_bytes(T)[:-10], "lm_head.weight': data_offsets")

    # header entries
    hdr_case("st-unknown-dtype", lambda h: h[Q].update(dtype="F12"), Q + "': unknown dtype")
    hdr_case("st-dtype-not-string", lambda h: h[Q].update(dtype=16), Q + "': 'dtype'")
    hdr_case("st-shape-not-array", lambda h: h[Q].update(shape="8x8"), Q + "': 'shape'")
    hdr_case("st-size-mismatch", lambda h: h[Q].update(shape=[2, 2]), Q + "': data_offsets")
    hdr_case("st-negative-dim", lambda h: h[Q].update(shape=[-8, -8]), Q + "': shape dimension")
    hdr_case("st-fractional-dim", lambda h: h[Q].update(shape=[8.5, 8]), Q + "': shape dimension")
    hdr_case("st-overflow-dims", lambda h: h[Q].update(shape=[2**40, 2**40]), Q + "': shape overflows")
    hdr_case("st-overflow-bytes", lambda h: h[Q].update(shape=[2**31, 2**31, 2]),
             Q + "': shape overflows")
    hdr_case("st-too-many-dims", lambda h: h[Q].update(shape=[1] * 9 + [64]), Q + "': shape has more")
    hdr_case("st-offsets-not-pair", lambda h: h[Q].update(data_offsets=[0]), Q + "': 'data_offsets'")
    hdr_case("st-offsets-negative", lambda h: h[Q].update(data_offsets=[-2, 126]),
             Q + "': data_offsets are not")
    hdr_case("st-offsets-reversed",
             lambda h: h[Q].update(data_offsets=h[Q]["data_offsets"][::-1]), Q + "': data_offsets [")

    def overlap(h):
        b, e = h[K]["data_offsets"]
        h[K]["data_offsets"] = [b - 16, e - 16]
    hdr_case("st-overlap", overlap, "overlap")

    def gap(h):
        # Every tensor from up_proj on moves 2 bytes later, and the file grows by 2.
        start = h[UP]["data_offsets"][0]
        for k, v in h.items():
            if k != "__metadata__" and v["data_offsets"][0] >= start:
                v["data_offsets"] = [v["data_offsets"][0] + 2, v["data_offsets"][1] + 2]
    hdr_case("st-gap", gap, UP + "': data_offsets", extra=b"\0\0")

    def hole(h):
        h.pop(UP)
    hdr_case("st-hole", hole, "leave a gap")

    def past_end(h):
        b, e = h["lm_head.weight"]["data_offsets"]
        h["lm_head.weight"]["data_offsets"] = [b + 64, e + 64]
    hdr_case("st-out-of-range", past_end, "lm_head.weight': data_offsets")
    st_case("st-trailing-data", st_bytes(T, extra=b"\0" * 16), "data buffer holds")
    dup = json.dumps(H, separators=(",", ":"))[:-1] + ',"' + Q + '":' + json.dumps(H[Q]) + "}"
    st_case("st-duplicate-name", st_bytes(T, header=dup.encode()), Q + "' is listed twice")
    dup2 = json.dumps({Q: {"dtype": "F16", "shape": [0], "data_offsets": [0, 0]}},
                      separators=(",", ":"))[:-1] + ',"' + Q + '":{"dtype":"F16","shape":[0],"data_offsets":[0,0]}}'
    st_case("st-duplicate-empty", st_bytes([], header=dup2.encode()), Q + "' is listed twice")
    hdr_case("st-metadata-not-strings", lambda h: h.update(__metadata__={"format": 1}),
             "'__metadata__' entry 'format'")
    hdr_case("st-metadata-not-object", lambda h: h.update(__metadata__=["pt"]), "'__metadata__'")

    # tensors against the config
    st_case("model-missing-tensor", st_bytes([t for t in T if t[0] != UP]), UP + "' is missing")
    st_case("model-wrong-dtype", st_bytes(replace(T, Q, dtype="I16")), Q + "': dtype I16")
    st_case("model-shape-mismatch", st_bytes(replace(T, K, shape=[8, 8])), K + "': shape [8, 8]")
    st_case("model-norm-shape", st_bytes(replace(T, "model.norm.weight", shape=[2])),
            "model.norm.weight': shape")
    st_case("model-missing-lm-head", st_bytes([t for t in T if t[0] != "lm_head.weight"]),
            "lm_head.weight' is missing")
    st_case("model-qwen2-missing-bias", st_bytes(T), "q_proj.bias' is missing",
            config=dense_config(architectures=["Qwen2ForCausalLM"]))
    out.append(("model-no-weights", {"config.json": dense_config()}, "model.safetensors",
                "cannot open"))

    # config.json: refused before any weight is opened, so these need no safetensors
    def cfg_case(name, detail, files=None, **over):
        c = dense_config(**over)
        f = {"config.json": c}
        f.update(files or {})
        out.append((name, f, "config.json", detail))

    cfg_case("cfg-arch-unsupported", "'GPT2LMHeadModel' is not supported",
             architectures=["GPT2LMHeadModel"])
    cfg_case("cfg-arch-missing", "'architectures'", architectures=None)
    cfg_case("cfg-arch-not-list", "'architectures'", architectures="LlamaForCausalLM")
    cfg_case("cfg-hidden-string", "'hidden_size'", hidden_size="4")
    cfg_case("cfg-hidden-zero", "'hidden_size'", hidden_size=0)
    cfg_case("cfg-hidden-float", "'hidden_size'", hidden_size=8.5)
    cfg_case("cfg-intermediate-negative", "'intermediate_size'", intermediate_size=-16)
    cfg_case("cfg-layers-huge", "'num_hidden_layers'", num_hidden_layers=10**12)
    cfg_case("cfg-vocab-missing", "'vocab_size' is missing", vocab_size=None)
    cfg_case("cfg-kv-heads-not-dividing", "'num_key_value_heads'", num_key_value_heads=3,
             num_attention_heads=4)
    cfg_case("cfg-heads-not-dividing-hidden", "'num_attention_heads'", num_attention_heads=3,
             num_key_value_heads=1, head_dim=None)
    cfg_case("cfg-head-dim-odd", "'head_dim'", head_dim=3)
    cfg_case("cfg-head-dim-zero", "'head_dim'", head_dim=0)
    cfg_case("cfg-eps-zero", "'rms_norm_eps'", rms_norm_eps=0)
    cfg_case("cfg-tie-not-bool", "'tie_word_embeddings'", tie_word_embeddings="yes")
    cfg_case("cfg-eos-string", "'eos_token_id'", eos_token_id="</s>")
    cfg_case("cfg-eos-out-of-vocab", "'eos_token_id'", eos_token_id=[2, 4])
    cfg_case("cfg-bos-negative", "'bos_token_id'", bos_token_id=-1)
    cfg_case("cfg-act-gelu", "'hidden_act'", hidden_act="gelu")
    cfg_case("cfg-rope-linear", "'rope_scaling.type': RoPE scaling 'linear'",
             rope_scaling={"type": "linear", "factor": 2.0})
    cfg_case("cfg-rope-dynamic", "'rope_parameters.rope_type': RoPE scaling 'dynamic'",
             rope_scaling=None, rope_theta=None,
             rope_parameters={"rope_theta": 10000.0, "rope_type": "dynamic", "factor": 2.0})
    cfg_case("cfg-rope-no-type", "'rope_scaling.type' is missing", rope_scaling={"factor": 2.0})
    cfg_case("cfg-rope-theta-string", "'rope_theta'", rope_theta="1e4")
    cfg_case("cfg-rope-params-theta-zero", "'rope_parameters.rope_theta'",
             rope_parameters={"rope_theta": 0, "rope_type": "default"})
    cfg_case("cfg-yarn-no-factor", "'rope_scaling.factor' is missing",
             rope_scaling={"rope_type": "yarn", "original_max_position_embeddings": 32})
    cfg_case("cfg-yarn-beta", "'rope_scaling.beta_fast'",
             rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 1, "beta_slow": 32})
    cfg_case("cfg-llama3-freqs", "'rope_scaling.high_freq_factor'",
             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                           "high_freq_factor": 1.0, "original_max_position_embeddings": 32})
    cfg_case("cfg-llama3-missing", "'rope_parameters.low_freq_factor' is missing",
             rope_parameters={"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0})
    cfg_case("cfg-sliding-window", "'use_sliding_window'",
             architectures=["Qwen2ForCausalLM"], use_sliding_window=True)
    cfg_case("cfg-quant-gptq", "quantization method 'gptq'",
             quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128})
    cfg_case("cfg-quant-gemv", "'quantization_config.version': the AWQ GEMV layout",
             quantization_config=dict(AWQ_QC, version="GEMV"))
    cfg_case("cfg-quant-version", "'quantization_config.version'",
             quantization_config=dict(AWQ_QC, version="marlin"))
    cfg_case("cfg-quant-bits", "'quantization_config.bits'",
             quantization_config=dict(AWQ_QC, bits=8))
    cfg_case("cfg-quant-group", "'quantization_config.group_size'",
             quantization_config=dict(AWQ_QC, group_size=96))
    cfg_case("cfg-quant-no-zero", "'quantization_config.zero_point'",
             quantization_config=dict(AWQ_QC, zero_point=False))
    cfg_case("cfg-quant-skip-type", "'quantization_config.modules_to_not_convert'",
             quantization_config=dict(AWQ_QC, modules_to_not_convert="lm_head"))
    cfg_case("cfg-quant-not-object", "'quantization_config'", quantization_config="awq")
    out.append(("cfg-invalid-json", {"config.json": b'{"architectures": ["LlamaForCausalLM"],'},
                "config.json", "not valid JSON"))
    out.append(("cfg-not-object", {"config.json": b"[]"},
                "config.json", "not a JSON object"))
    out.append(("cfg-missing", {"model.safetensors": st_bytes([])}, "config.json", "cannot open"))
    out.append(("cfg-legacy-gemv", {"config.json": dense_config(),
                                    "quant_config.json": {"zero_point": True, "q_group_size": 128,
                                                          "w_bit": 4, "version": "GEMV"}},
                "quant_config.json", "'version'"))
    out.append(("cfg-legacy-bits", {"config.json": dense_config(),
                                    "quant_config.json": {"zero_point": True, "q_group_size": 128,
                                                          "w_bit": 3, "version": "GEMM"}},
                "quant_config.json", "'w_bit'"))

    # AWQ tensors
    A = awq_tensors()
    QW = "model.layers.0.self_attn.q_proj"

    def awq_case(name, tensors, detail, config=None, file="model.safetensors"):
        out.append((name, {"config.json": config or awq_config(),
                           "model.safetensors": st_bytes(tensors)}, file, detail))

    awq_case("awq-qweight-dtype", replace(A, QW + ".qweight", dtype="F32"),
             QW + ".qweight': dtype F32, expected I32")
    awq_case("awq-scales-shape", replace(A, QW + ".scales", shape=[2, 32]), QW + ".scales': shape")
    awq_case("awq-qzeros-missing", [t for t in A if t[0] != QW + ".qzeros"],
             QW + ".qzeros' is missing")
    awq_case("awq-dense-config", A, QW + ".weight' is missing, but",
             config=dense_config(hidden_size=32, intermediate_size=32, head_dim=16, vocab_size=4))
    awq_case("awq-group-vs-hidden", A, "cannot pack",
             config=awq_config(quantization_config=dict(AWQ_QC, group_size=64)),
             file="model.safetensors")

    # sharded index
    S1 = [t for t in T if "mlp" not in t[0]]
    S2 = [t for t in T if "mlp" in t[0]]
    n1, n2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    wm = {t[0]: n1 for t in S1}
    wm.update({t[0]: n2 for t in S2})

    def idx_case(name, weight_map, detail, shards=None, index=None,
                 file="model.safetensors.index.json"):
        f = {"config.json": dense_config(),
             "model.safetensors.index.json": index if index is not None else
             {"metadata": {"total_size": len(data)}, "weight_map": weight_map}}
        f.update(shards if shards is not None else {n1: st_bytes(S1), n2: st_bytes(S2)})
        out.append((name, f, file, detail))

    idx_case("idx-missing-shard", wm, "cannot open", shards={n1: st_bytes(S1)})
    idx_case("idx-tensor-not-in-shard", dict(wm, **{UP: n1}), UP + "' is mapped to " + n1)
    idx_case("idx-path-traversal", dict(wm, **{UP: "../" + n2}), "not a plain file name")
    idx_case("idx-path-slash", dict(wm, **{UP: "sub/" + n2}), "not a plain file name")
    idx_case("idx-unmapped-tensor", {k: v for k, v in wm.items() if k != UP},
             UP + "' is not in the weight_map")
    idx_case("idx-no-weight-map", None, "'weight_map'", index={"metadata": {}})
    idx_case("idx-not-json", None, "not a JSON object", index=b"{weight_map")
    idx_case("idx-shard-not-string", dict(wm, **{UP: 2}), "'" + UP + "' is not a file name")
    idx_case("idx-tensor-in-two-shards", wm, UP + "' is in both",
             shards={n1: st_bytes(S1 + [t for t in S2 if t[0] == UP]), n2: st_bytes(S2)}, file=n1)
    # A broken shard: the message names the shard and the entry that led to it.
    bad = json.loads(json.dumps(header_of(S2)))
    bad[UP]["dtype"] = "Q4"
    out.append(("idx-bad-shard", {"config.json": dense_config(),
                                  "model.safetensors.index.json":
                                  {"metadata": {}, "weight_map": wm},
                                  n1: st_bytes(S1), n2: st_bytes(S2, header=bad)},
                n2, UP + "': unknown dtype 'Q4'"))
    return out


def seeds():
    T = dense_tensors()
    A = awq_tensors()
    st = {"dense.safetensors": st_bytes(T, metadata={"format": "pt"}),
          "awq.safetensors": st_bytes(A, metadata={"format": "pt"}),
          "unpadded.safetensors": st_bytes(T, pad=False),
          "empty.safetensors": st_bytes([]),
          "zero-size.safetensors": st_bytes([("a", "F32", [0, 4], b""), ("b", "BOOL", [2], b"\1\0")])}
    qwen = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 512,
            "intermediate_size": 1408, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 1024, "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "use_sliding_window": False,
            "sliding_window": None, "bos_token_id": None, "eos_token_id": None,
            "rope_theta": 10000.0, "quantization_config": dict(AWQ_QC, group_size=128)}
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
             "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 1, "head_dim": 128, "vocab_size": 1024,
             "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "bos_token_id": 1,
             "eos_token_id": 2, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
             "attention_bias": False, "mlp_bias": False,
             "quantization_config": dict(AWQ_QC, group_size=128)}
    cfg = {"qwen2.json": qwen, "llama.json": llama,
           "llama3.json": dict(llama, rope_parameters={
               "rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}, eos_token_id=[2, 3, 7]),
           "yarn.json": dict(qwen, rope_scaling={"type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 1024,
                                                 "mscale": 0.707, "mscale_all_dim": 0.707}),
           "dense.json": dense_config(tie_word_embeddings=True),
           "skip.json": dict(qwen, quantization_config=dict(
               AWQ_QC, modules_to_not_convert=["mlp.down_proj", "lm_head"]))}
    return st, cfg


def write(path, content):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if isinstance(content, dict):
        content = json.dumps(content, separators=(",", ":")).encode()
    elif isinstance(content, str):
        content = content.encode()
    with open(path, "wb") as f:
        f.write(content)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    corpus, seed_dir = os.path.join(root, "corpus"), os.path.join(root, "seeds")
    for d in (corpus, seed_dir):
        shutil.rmtree(d, ignore_errors=True)
    manifest = ["# case<TAB>file the message names<TAB>detail it must contain"]
    names = set()
    for name, files, file, detail in cases():
        assert name not in names, name
        names.add(name)
        for rel, content in files.items():
            # A dict that is None (a removed config key) is dropped by dense_config's caller.
            if isinstance(content, dict):
                content = {k: v for k, v in content.items() if v is not None or k in (
                    "rope_scaling", "bos_token_id", "eos_token_id", "sliding_window")}
            write(os.path.join(corpus, name, rel), content)
        manifest.append(f"{name}\t{file}\t{detail}")
    write(os.path.join(corpus, "MANIFEST"), "\n".join(manifest) + "\n")
    st, cfg = seeds()
    for rel, content in st.items():
        write(os.path.join(seed_dir, "st", rel), content)
    for rel, content in cfg.items():
        write(os.path.join(seed_dir, "config", rel), content)


if __name__ == "__main__":
    main()
