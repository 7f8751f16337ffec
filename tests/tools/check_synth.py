# SPDX-License-Identifier: MIT
# dsquant synth: determinism (same seed, same bytes; another seed, other weights; the
# build's embedded model equals a fresh --shape tiny), the AWQ layout of every decoder
# linear, dequantized weights of the intended scale, --config shapes, the tokenizer's
# structure, dsquant inspect, and option errors. test-synth-tokenizer encodes with it.
# Usage: check_synth.py EMBEDDED_TINY_DIR
import json
import math
import os
import shutil
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stcheck import check, read_safetensors, run, tensor_bytes  # noqa: E402

dsquant = os.environ["DSQUANT"]
embedded = sys.argv[1]
FILES = ["README.md", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
REV = [0, 4, 1, 5, 2, 6, 3, 7]


def read(path):
    with open(path, "rb") as f:
        return f.read()


def f16(h):
    return struct.unpack("<e", struct.pack("<H", h))[0]


def check_layout(d, arch_biases, hidden, inter, layers, heads, kv, hd, vocab, gs):
    header, _, data = read_safetensors(os.path.join(d, "model.safetensors"))
    want = {"model.embed_tokens.weight": ("F16", [vocab, hidden]), "model.norm.weight": ("F16", [hidden]),
            "lm_head.weight": ("F16", [vocab, hidden])}
    lin = {"self_attn.q_proj": (hidden, heads * hd), "self_attn.k_proj": (hidden, kv * hd),
           "self_attn.v_proj": (hidden, kv * hd), "self_attn.o_proj": (heads * hd, hidden),
           "mlp.gate_proj": (hidden, inter), "mlp.up_proj": (hidden, inter), "mlp.down_proj": (inter, hidden)}
    for L in range(layers):
        p = "model.layers.%d." % L
        want[p + "input_layernorm.weight"] = ("F16", [hidden])
        want[p + "post_attention_layernorm.weight"] = ("F16", [hidden])
        for name, (i, o) in lin.items():
            want[p + name + ".qweight"] = ("I32", [i, o // 8])
            want[p + name + ".qzeros"] = ("I32", [i // gs, o // 8])
            want[p + name + ".scales"] = ("F16", [i // gs, o])
            if arch_biases and name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                want[p + name + ".bias"] = ("F16", [o])
    check(set(header) == set(want), "%s: extra %s, missing %s" % (d, sorted(set(header) - set(want)),
                                                                  sorted(set(want) - set(header))))
    for name, (dt, shape) in want.items():
        check(header[name]["dtype"] == dt and header[name]["shape"] == shape,
              "%s: %s is %s %s, want %s %s" % (d, name, header[name]["dtype"], header[name]["shape"], dt, shape))

    norm = struct.unpack("<%dH" % hidden, tensor_bytes(header, data, "model.layers.0.input_layernorm.weight"))
    check(all(f16(h) == 1.0 for h in norm), "norm weights are not 1.0")

    # Dequantize layer 0's q_proj with the formats.md reading and look at its spread.
    i, o = lin["self_attn.q_proj"]
    base = "model.layers.0.self_attn.q_proj."
    qw = struct.unpack("<%dI" % (i * o // 8), tensor_bytes(header, data, base + "qweight"))
    qz = struct.unpack("<%dI" % (i // gs * o // 8), tensor_bytes(header, data, base + "qzeros"))
    sc = struct.unpack("<%dH" % (i // gs * o), tensor_bytes(header, data, base + "scales"))
    s1 = s2 = 0.0
    for k in range(0, i, 3):
        g = k // gs
        for n in range(o):
            q = (qw[k * (o // 8) + n // 8] >> (4 * REV[n % 8])) & 15
            z = (qz[g * (o // 8) + n // 8] >> (4 * REV[n % 8])) & 15
            w = (q - z) * f16(sc[g * o + n])
            s1 += w
            s2 += w * w
    cnt = len(range(0, i, 3)) * o
    std = math.sqrt(s2 / cnt - (s1 / cnt) ** 2)
    check(0.012 < std < 0.03, "%s: dequantized q_proj has std %.4f, want about 0.02" % (d, std))
    return header


def main():
    tmp = tempfile.mkdtemp(prefix="dsquant-synth-")
    try:
        a, b, c = (os.path.join(tmp, x) for x in "abc")
        p = run([dsquant, "synth", "--shape", "tiny", a, "--seed", "5"])
        check("random" in p.stderr, "final line does not say the weights are random: %r" % p.stderr)
        run([dsquant, "synth", "--seed", "5", "--shape", "tiny", b])
        run([dsquant, "synth", "--shape", "tiny", "--seed", "6", c])
        check(sorted(os.listdir(a)) == FILES, "files: %s" % sorted(os.listdir(a)))
        for f in FILES:
            check(read(os.path.join(a, f)) == read(os.path.join(b, f)), "%s differs for the same seed" % f)
        check(read(os.path.join(a, "model.safetensors")) != read(os.path.join(c, "model.safetensors")),
              "model.safetensors is the same for seeds 5 and 6")
        check(read(os.path.join(a, "tokenizer.json")) == read(os.path.join(c, "tokenizer.json")),
              "the tokenizer depends on the seed")

        # The build's embedded model is --shape tiny with the default seed.
        d = os.path.join(tmp, "default")
        run([dsquant, "synth", "--shape", "tiny", d])
        for f in FILES:
            check(read(os.path.join(d, f)) == read(os.path.join(embedded, f)),
                  "%s of the embedded model differs from a fresh synth" % f)

        with open(os.path.join(a, "config.json")) as f:
            cfg = json.load(f)
        expect = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 256, "intermediate_size": 768,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "vocab_size": 512, "max_position_embeddings": 2048, "rope_theta": 10000,
                  "rms_norm_eps": 1e-6, "_dsd_synthetic": True, "tie_word_embeddings": False,
                  "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
                                          "version": "gemm", "modules_to_not_convert": None}}
        for k, v in expect.items():
            check(cfg.get(k) == v, "config.json %s = %r, want %r" % (k, cfg.get(k), v))
        check_layout(a, True, 256, 768, 2, 4, 2, 64, 512, 128)

        # The tokenizer: ids within the model's vocabulary, specials as in config.json.
        with open(os.path.join(a, "tokenizer.json")) as f:
            tj = json.load(f)
        with open(os.path.join(a, "tokenizer_config.json")) as f:
            tc = json.load(f)
        specials = {t["content"]: t["id"] for t in tj["added_tokens"]}
        ids = list(tj["model"]["vocab"].values()) + list(specials.values())
        check(sorted(ids) == list(range(len(ids))) and len(ids) <= 512, "token ids are not 0..n-1 within 512")
        check(cfg["eos_token_id"] == [specials["<|endoftext|>"], specials["<|im_end|>"]], "eos_token_id")
        check("<|im_start|>" in tc["chat_template"] and tc["eos_token"] == "<|endoftext|>", "tokenizer_config")
        for left, right in tj["model"]["merges"]:
            check(left in tj["model"]["vocab"] and right in tj["model"]["vocab"]
                  and left + right in tj["model"]["vocab"], "merge %r %r is not closed" % (left, right))

        run([dsquant, "inspect", "--model", a])

        # --config: a Llama shape, tied, group 64, with head_dim given.
        cfgfile = os.path.join(tmp, "llama.json")
        with open(cfgfile, "w") as f:
            json.dump({"architectures": ["LlamaForCausalLM"], "hidden_size": 128, "intermediate_size": 320,
                       "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                       "head_dim": 64, "vocab_size": 300, "tie_word_embeddings": True,
                       "quantization_config": {"group_size": 64}}, f)
        e = os.path.join(tmp, "e")
        run([dsquant, "synth", "--config", cfgfile, e])
        header = read_safetensors(os.path.join(e, "model.safetensors"))[0]
        check("lm_head.weight" not in header, "a tied model has lm_head")
        check(not any(n.endswith(".bias") for n in header), "a Llama model has biases")
        check(header["model.layers.0.mlp.down_proj.scales"]["shape"] == [5, 128], "group size 64 not used")
        run([dsquant, "inspect", "--model", e])

        # Errors name the option or the file.
        for args, word in ((["--shape", "huge", os.path.join(tmp, "x")], "huge"),
                           (["--shape", "tiny", "--seed", "abc", os.path.join(tmp, "x")], "--seed"),
                           (["--shape", "tiny", "--config", cfgfile, os.path.join(tmp, "x")], "--config"),
                           (["--shape", "tiny"], "OUTDIR"),
                           (["--config", os.path.join(tmp, "missing.json"), os.path.join(tmp, "x")], "missing.json")):
            p = run([dsquant, "synth"] + args, expect_ok=False)
            check(word in p.stderr, "synth %s: message %r does not name %s" % (" ".join(args), p.stderr, word))
        with open(cfgfile, "w") as f:
            json.dump({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 100, "intermediate_size": 320,
                       "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 300}, f)
        p = run([dsquant, "synth", "--config", cfgfile, os.path.join(tmp, "x")], expect_ok=False)
        check("group size" in p.stderr, "indivisible shape message: %r" % p.stderr)
        check(not os.path.exists(os.path.join(tmp, "x")), "output written for a bad shape")
    finally:
        shutil.rmtree(tmp)
    print("ok")


main()
