#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""dsquant inspect on malformed DeepSeek checkpoints made on the fly from the tiny V2/V3
fixtures: each must exit non-zero (not by a signal) with an error naming the file and the
field or tensor at fault. Then inspect must succeed on both fixtures as they are.

    test-moe-malformed.py DSQUANT   (DSD_SHARED from the environment)
"""
import json
import os
import struct
import subprocess
import sys
import tempfile


def config_case(fix, edit):
    def make(src, dst):
        with open(os.path.join(src, "config.json")) as f:
            cfg = json.load(f)
        edit(cfg)
        with open(os.path.join(dst, "config.json"), "w") as f:
            json.dump(cfg, f)
        os.symlink(os.path.join(src, "model.safetensors"), os.path.join(dst, "model.safetensors"))
    return fix, make


def tensor_case(fix, edit):
    """edit(header) changes the safetensors header in place; the data is copied as is."""
    def make(src, dst):
        with open(os.path.join(src, "model.safetensors"), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            data = f.read()
        edit(header)
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(os.path.join(dst, "model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + data)
        os.symlink(os.path.join(src, "config.json"), os.path.join(dst, "config.json"))
    return fix, make


def rename(old, new):
    def edit(h):
        h[new] = h.pop(old)
    return edit


def retag(name, **kw):
    def edit(h):
        h[name].update(kw)
    return edit


def setkey(key, value):
    def edit(c):
        c[key] = value
    return edit


def delkey(key):
    def edit(c):
        del c[key]
    return edit


def rope(key, value):
    def edit(c):
        c["rope_scaling"][key] = value
    return edit


V2, V3 = "tiny-deepseek-v2-awq", "tiny-deepseek-v3-awq"
L1 = "model.layers.1."

# (name, case, file the message must name, text it must contain)
CASES = [
    ("kv-lora-missing", config_case(V2, delkey("kv_lora_rank")), "config.json", "'kv_lora_rank' is missing"),
    ("rope-dim-odd", config_case(V2, setkey("qk_rope_head_dim", 33)), "config.json", "'qk_rope_head_dim'"),
    ("q-lora-string", config_case(V2, setkey("q_lora_rank", "x")), "config.json", "'q_lora_rank'"),
    ("topk-method", config_case(V2, setkey("topk_method", "bogus")), "config.json", "'topk_method'"),
    ("scoring-mismatch", config_case(V2, setkey("scoring_func", "sigmoid")), "config.json", "'scoring_func'"),
    ("scoring-unknown", config_case(V3, setkey("scoring_func", "tanh")), "config.json", "'scoring_func'"),
    ("n-group-divides", config_case(V3, setkey("n_group", 3)), "config.json", "'n_group'"),
    ("topk-group-over", config_case(V3, setkey("topk_group", 5)), "config.json", "'topk_group'"),
    ("experts-per-tok", config_case(V2, setkey("num_experts_per_tok", 9)), "config.json", "'num_experts_per_tok'"),
    ("moe-width-missing", config_case(V2, delkey("moe_intermediate_size")), "config.json", "'moe_intermediate_size'"),
    ("scaling-negative", config_case(V2, setkey("routed_scaling_factor", -1)), "config.json", "'routed_scaling_factor'"),
    ("layer-freq-zero", config_case(V2, setkey("moe_layer_freq", 0)), "config.json", "'moe_layer_freq'"),
    ("norm-topk-string", config_case(V3, setkey("norm_topk_prob", "yes")), "config.json", "'norm_topk_prob'"),
    ("mscale-string", config_case(V2, rope("mscale_all_dim", "a")), "config.json", "'rope_scaling.mscale_all_dim'"),
    ("attention-bias", config_case(V2, setkey("attention_bias", True)), "config.json", "'attention_bias'"),
    ("q-lora-dropped", config_case(V3, setkey("q_lora_rank", None)), "model.safetensors",
     "'model.layers.0.self_attn.q_proj.qweight' is missing"),
    ("kv-lora-shape", config_case(V2, setkey("kv_lora_rank", 128)), "model.safetensors",
     "'model.layers.0.self_attn.kv_a_proj_with_mqa.qweight'"),
    ("bias-missing", tensor_case(V3, rename(L1 + "mlp.gate.e_score_correction_bias", L1 + "mlp.gate.bias")),
     "model.safetensors", "'model.layers.1.mlp.gate.e_score_correction_bias' is missing"),
    ("router-shape", tensor_case(V2, retag(L1 + "mlp.gate.weight", shape=[4, 1024])), "model.safetensors",
     "'model.layers.1.mlp.gate.weight'"),
    ("router-dtype", tensor_case(V2, retag(L1 + "mlp.gate.weight", dtype="I16")), "model.safetensors",
     "'model.layers.1.mlp.gate.weight'"),
    ("expert-missing", tensor_case(V2, rename("model.layers.2.mlp.experts.7.up_proj.qweight",
                                              "model.layers.2.mlp.experts.8.up_proj.qweight")),
     "model.safetensors", "'model.layers.2.mlp.experts.7.up_proj.qweight' is missing"),
    ("shared-missing", tensor_case(V2, rename(L1 + "mlp.shared_experts.down_proj.scales",
                                              L1 + "mlp.shared_expert.down_proj.scales")),
     "model.safetensors", "'model.layers.1.mlp.shared_experts.down_proj.scales' is missing"),
    ("kv-b-dtype", tensor_case(V2, retag("model.layers.0.self_attn.kv_b_proj.qweight", dtype="F32")),
     "model.safetensors", "'model.layers.0.self_attn.kv_b_proj.qweight': dtype F32"),
    ("q-a-norm-missing", tensor_case(V3, rename("model.layers.2.self_attn.q_a_layernorm.weight",
                                                "model.layers.2.self_attn.q_a_norm.weight")),
     "model.safetensors", "'model.layers.2.self_attn.q_a_layernorm.weight' is missing"),
]


def inspect(dsquant, model):
    return subprocess.run([dsquant, "inspect", "--model", model], capture_output=True, text=True,
                          errors="replace", timeout=60)


def main():
    dsquant = sys.argv[1]
    shared = os.environ.get("DSD_SHARED")
    if not shared:
        print("DSD_SHARED is not set; run through 'meson test'")
        return 1
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (fix, make), file, detail in CASES:
            dst = os.path.join(tmp, name)
            os.mkdir(dst)
            make(os.path.join(shared, "fixtures", fix), dst)
            r = inspect(dsquant, dst)
            msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
            if r.returncode <= 0:
                failures.append(f"{name}: exit status {r.returncode}, expected an error")
            elif file not in msg or detail not in msg:
                failures.append(f"{name}: message lacks {file!r} or {detail!r}: {msg}")
            else:
                print(f"{name}: {msg}")
    for fix in (V2, V3):
        r = inspect(dsquant, os.path.join(shared, "fixtures", fix))
        if r.returncode != 0:
            failures.append(f"{fix}: inspect failed: {r.stderr.strip()}")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
