# SPDX-License-Identifier: MIT
# dsquant convert --from llama2c on stories260K: tensor names and shapes, every tensor's
# bytes against the llama2.c file (q/k rows through an independent rendering of Hugging
# Face's permute()), config.json, tokenizer files, and errors for broken inputs.
import json
import os
import shutil
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stcheck import check, read_safetensors, run, tensor_bytes  # noqa: E402

dsquant = os.environ["DSQUANT"]
shared = os.environ["DSD_SHARED"]
ckpt = os.path.join(shared, "models/stories260K/stories260K.bin")
tok = os.path.join(shared, "models/stories260K/tok512.bin")


def hf_permute_order(n_heads, dim1):
    """Source row of each output row of w.view(n_heads, dim1 // n_heads // 2, 2, dim2)
    .transpose(1, 2).reshape(dim1, dim2), computed by building the index tensor."""
    half = dim1 // n_heads // 2
    rows = list(range(dim1))
    # view: [h][i][j] with j the fastest index
    viewed = [[[rows[(h * half + i) * 2 + j] for j in range(2)] for i in range(half)] for h in range(n_heads)]
    # transpose(1, 2): [h][j][i], then flatten
    return [viewed[h][i][j] for h in range(n_heads) for j in range(2) for i in range(half)]


def main():
    tmp = tempfile.mkdtemp(prefix="dsquant-convert-")
    try:
        out = os.path.join(tmp, "stories")
        p = run([dsquant, "convert", "--from", "llama2c", ckpt, tok, out])
        check("model.safetensors" in p.stderr, "no final line naming what was written: %r" % p.stderr)

        with open(ckpt, "rb") as f:
            blob = f.read()
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack_from("<7i", blob, 0)
        tied = vocab > 0
        vocab = abs(vocab)
        hd = dim // n_heads
        kv_dim = hd * n_kv
        fl = blob[28:]
        pos = [0]

        def take(*shape):
            n = 1
            for d in shape:
                n *= d
            b = fl[pos[0] * 4:(pos[0] + n) * 4]
            pos[0] += n
            return b

        src = {"emb": take(vocab, dim), "rms_att": take(n_layers, dim), "wq": take(n_layers, dim, dim),
               "wk": take(n_layers, kv_dim, dim), "wv": take(n_layers, kv_dim, dim),
               "wo": take(n_layers, dim, dim), "rms_ffn": take(n_layers, dim),
               "w1": take(n_layers, hidden, dim), "w2": take(n_layers, dim, hidden),
               "w3": take(n_layers, hidden, dim), "rms_final": take(dim)}

        def layer(name, L, rows, cols):
            n = rows * cols * 4
            return src[name][L * n:(L + 1) * n]

        header, meta, data = read_safetensors(os.path.join(out, "model.safetensors"))
        check(meta == {"format": "pt"}, "metadata %r" % meta)

        want = {"model.embed_tokens.weight": ([vocab, dim], src["emb"]),
                "model.norm.weight": ([dim], src["rms_final"])}
        if not tied:
            fail("stories260K is tied; this test expects no lm_head")
        for L in range(n_layers):
            p_ = "model.layers.%d." % L
            want[p_ + "input_layernorm.weight"] = ([dim], layer("rms_att", L, 1, dim))
            want[p_ + "post_attention_layernorm.weight"] = ([dim], layer("rms_ffn", L, 1, dim))
            want[p_ + "self_attn.q_proj.weight"] = ([dim, dim], None)
            want[p_ + "self_attn.k_proj.weight"] = ([kv_dim, dim], None)
            want[p_ + "self_attn.v_proj.weight"] = ([kv_dim, dim], layer("wv", L, kv_dim, dim))
            want[p_ + "self_attn.o_proj.weight"] = ([dim, dim], layer("wo", L, dim, dim))
            want[p_ + "mlp.gate_proj.weight"] = ([hidden, dim], layer("w1", L, hidden, dim))
            want[p_ + "mlp.up_proj.weight"] = ([hidden, dim], layer("w3", L, hidden, dim))
            want[p_ + "mlp.down_proj.weight"] = ([dim, hidden], layer("w2", L, dim, hidden))

        check(set(header) == set(want), "tensor names differ: extra %s, missing %s"
              % (sorted(set(header) - set(want)), sorted(set(want) - set(header))))
        for name, (shape, b) in want.items():
            check(header[name]["dtype"] == "F32", "%s dtype %s" % (name, header[name]["dtype"]))
            check(header[name]["shape"] == shape, "%s shape %s, want %s" % (name, header[name]["shape"], shape))
            if b is not None:
                check(tensor_bytes(header, data, name) == b, "%s bytes differ from the checkpoint" % name)

        # q and k rows: the permuted llama2.c rows, and not simply the same rows.
        for L in range(n_layers):
            for proj, srcname, heads, rows in (("q_proj", "wq", n_heads, dim), ("k_proj", "wk", n_kv, kv_dim)):
                got = tensor_bytes(header, data, "model.layers.%d.self_attn.%s.weight" % (L, proj))
                orig = layer(srcname, L, rows, dim)
                order = hf_permute_order(heads, rows)
                rb = dim * 4
                for r, s in enumerate(order):
                    check(got[r * rb:(r + 1) * rb] == orig[s * rb:(s + 1) * rb],
                          "layer %d %s row %d is not llama2.c row %d" % (L, proj, r, s))
                check(got != orig, "layer %d %s was not permuted" % (L, proj))

        with open(os.path.join(out, "config.json")) as f:
            cfg = json.load(f)
        expect = {"architectures": ["LlamaForCausalLM"], "hidden_size": dim, "intermediate_size": hidden,
                  "num_hidden_layers": n_layers, "num_attention_heads": n_heads, "num_key_value_heads": n_kv,
                  "vocab_size": vocab, "max_position_embeddings": seq_len, "rms_norm_eps": 1e-5,
                  "rope_theta": 10000, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": [2, 1]}
        for k, v in expect.items():
            check(cfg.get(k) == v, "config.json %s = %r, want %r" % (k, cfg.get(k), v))

        with open(os.path.join(out, "tokenizer_config.json")) as f:
            tc = json.load(f)
        check(tc.get("bos_token") == "<s>" and tc.get("eos_token") == "</s>" and tc.get("add_bos_token") is True
              and "chat_template" not in tc, "tokenizer_config.json %r" % tc)
        with open(os.path.join(out, "tokenizer.json")) as f:
            tj = json.load(f)
        check(isinstance(tj, dict) and "model" in tj, "tokenizer.json has no model")

        # Converting again over an existing directory replaces the files in place.
        run([dsquant, "convert", "--from", "llama2c", ckpt, tok, out])
        check(sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer.json",
                                          "tokenizer_config.json"], "files: %s" % os.listdir(out))

        # Broken inputs: a clear error naming the file or the option, and no output.
        short = os.path.join(tmp, "short.bin")
        with open(short, "wb") as f:
            f.write(blob[:-4])
        p = run([dsquant, "convert", "--from", "llama2c", short, tok, os.path.join(tmp, "o1")], expect_ok=False)
        check(short in p.stderr and "bytes" in p.stderr, "truncated file message: %r" % p.stderr)
        check(not os.path.exists(os.path.join(tmp, "o1", "model.safetensors")), "output written for a bad file")

        bad = os.path.join(tmp, "bad.bin")
        with open(bad, "wb") as f:
            f.write(struct.pack("<7i", 64, 172, 5, 7, 4, 512, 512) + blob[28:])
        p = run([dsquant, "convert", "--from", "llama2c", bad, tok, os.path.join(tmp, "o2")], expect_ok=False)
        check(bad in p.stderr, "bad header message: %r" % p.stderr)

        huge = os.path.join(tmp, "huge.bin")
        with open(huge, "wb") as f:
            f.write(struct.pack("<7i", 2**30, 2**30, 2**30, 2**20, 2**20, 2**30, 2**30) + blob[28:])
        p = run([dsquant, "convert", "--from", "llama2c", huge, tok, os.path.join(tmp, "o3")], expect_ok=False)
        check(huge in p.stderr, "overflowing header message: %r" % p.stderr)

        notok = os.path.join(tmp, "missing-tok.bin")
        p = run([dsquant, "convert", "--from", "llama2c", ckpt, notok, os.path.join(tmp, "o6")], expect_ok=False)
        check(notok in p.stderr, "missing tokenizer message: %r" % p.stderr)
        check(not os.path.exists(os.path.join(tmp, "o6")), "output written with a missing tokenizer")

        p = run([dsquant, "convert", "--from", "gguf", ckpt, tok, os.path.join(tmp, "o4")], expect_ok=False)
        check("--from" in p.stderr and "gguf" in p.stderr, "bad --from message: %r" % p.stderr)
        p = run([dsquant, "convert", ckpt, tok, os.path.join(tmp, "o5")], expect_ok=False)
        check("--from" in p.stderr, "missing --from message: %r" % p.stderr)
        p = run([dsquant, "convert", "--help"])
        check("eos_token_id" in p.stdout and "BOS" in p.stdout, "--help does not explain eos_token_id")
    finally:
        shutil.rmtree(tmp)
    print("ok")


main()
