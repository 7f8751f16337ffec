#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""dsquant eval against transformers: runs `dsquant eval --ids` over a fixture's golden
input ids and checks the logits file against golden_logits.f32 (rel err < 1e-4), and with
--lm-head-int8 within 2e-2 and not the same logits (test-lm-head-int8.c measured 6.5e-3). Then
`dsquant eval --text` on a `dsquant synth` model must print a finite perplexity, in
range for its random weights. Standard library only. Usage: eval-golden.py FIXTURE_DIR..."""
import array
import json
import math
import os
import subprocess
import sys
import tempfile

TOLERANCE = 1e-4
INT8_TOLERANCE = 2e-2


def read_f32(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return a


def check(dsquant, fixture, tmp, int8=False):
    golden = json.load(open(os.path.join(fixture, "golden.json")))
    ids_path = os.path.join(tmp, "ids.json")
    out_path = os.path.join(tmp, "logits.f32")
    json.dump(golden["input_ids"], open(ids_path, "w"))
    p = subprocess.run([dsquant, "eval", "--model", fixture, "--ids", ids_path,
                        "--logits-out", out_path, "--backend", "cpu"]
                       + (["--lm-head-int8"] if int8 else []),
                       check=True, capture_output=True, text=True)
    if int8 != ("lm_head int8 g128" in p.stderr):
        print(f"{fixture}: the timing line does not say what the lm_head is: {p.stderr}")
        return False
    out = read_f32(out_path)
    ref = read_f32(os.path.join(fixture, golden["logits_file"]))
    rows, vocab = golden["logits_shape"]
    if len(out) != rows * vocab or len(ref) != rows * vocab:
        print(f"{fixture}: {len(out)} logits, expected {rows * vocab}")
        return False
    diff = math.sqrt(sum((a - b) ** 2 for a, b in zip(out, ref)))
    err = diff / math.sqrt(sum(b * b for b in ref))
    print(f"{fixture}: dsquant eval{' --lm-head-int8' if int8 else ''} rel err {err:.3g}")
    return INT8_TOLERANCE > err > TOLERANCE if int8 else err < TOLERANCE


def check_text(dsquant, tmp):
    model = os.path.join(tmp, "synth")
    text = os.path.join(tmp, "text.txt")
    subprocess.run([dsquant, "synth", "--shape", "tiny", model], check=True,
                   stdout=subprocess.DEVNULL)
    vocab = json.load(open(os.path.join(model, "config.json")))["vocab_size"]
    with open(text, "w") as f:
        f.write("The quick brown fox jumps over the lazy dog. " * 4)
    out = subprocess.run([dsquant, "eval", "--model", model, "--text", text], check=True,
                         capture_output=True, text=True).stdout.split()
    if len(out) != 5 or out[0] != "perplexity":
        print(f"dsquant eval --text printed {out}")
        return False
    ppl = float(out[1])
    print(f"synthetic tiny model: perplexity {ppl:.2f} over {out[3]} tokens, vocab {vocab}")
    return math.isfinite(ppl) and 1.0 < ppl < 10 * vocab


def main():
    dsquant = os.environ["DSQUANT"]
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for fixture in sys.argv[1:]:
            ok &= check(dsquant, fixture, tmp)
        ok &= check(dsquant, sys.argv[1], tmp, int8=True)
        h = subprocess.run([dsquant, "eval", "--help"], capture_output=True, text=True)
        if "--lm-head-int8" not in h.stdout:
            print("dsquant eval --help does not document --lm-head-int8")
            ok = False
        ok &= check_text(dsquant, tmp)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
