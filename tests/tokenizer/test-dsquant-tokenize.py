#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# dsquant tokenize / detokenize on the Hugging Face vectors, plus the error paths.
# Usage: test-dsquant-tokenize.py TOKENIZER.json VECTORS.json
import json
import os
import subprocess
import sys

dsquant = os.environ["DSQUANT"]
tok, vectors = sys.argv[1], sys.argv[2]
cases = json.load(open(vectors, encoding="utf-8"))["cases"]


def run(cmd, stdin):
    return subprocess.run([dsquant, cmd, "--tokenizer", tok], input=stdin.encode(),
                          capture_output=True)


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(1)


p = run("tokenize", "".join(json.dumps(c["text"]) + "\n" for c in cases))
if p.returncode != 0:
    fail("tokenize failed: " + p.stderr.decode())
got = [json.loads(line) for line in p.stdout.decode().splitlines()]
bad = [i for i, c in enumerate(cases) if got[i] != c["ids"]]
if len(got) != len(cases) or bad:
    fail(f"tokenize: {len(bad)} of {len(cases)} cases differ, first {bad[:3]}")

p = run("detokenize", "".join(json.dumps(c["ids"]) + "\n" for c in cases))
if p.returncode != 0:
    fail("detokenize failed: " + p.stderr.decode())
got = [json.loads(line) for line in p.stdout.decode().splitlines()]
bad = [i for i, c in enumerate(cases) if got[i] != c["decoded"]]
if len(got) != len(cases) or bad:
    fail(f"detokenize: {len(bad)} of {len(cases)} cases differ, first {bad[:3]}")

# A NUL written as \u0000 survives the round trip.
p = run("tokenize", json.dumps("a\u0000b") + "\n")
ids = p.stdout.decode().strip()
p2 = run("detokenize", ids + "\n")
if json.loads(p2.stdout.decode()) != "a\u0000b":
    fail("NUL does not round-trip: " + p2.stdout.decode())

# Errors name the line, or the file.
p = run("tokenize", '"ok"\nnot json\n')
if p.returncode == 0 or b"<stdin>:2" not in p.stderr:
    fail("bad tokenize line not reported: " + p.stderr.decode())
p = run("detokenize", '[1, 2]\n[1, -5]\n')
if p.returncode == 0 or b"<stdin>:2" not in p.stderr:
    fail("bad detokenize line not reported: " + p.stderr.decode())
# An id past the vocabulary, or text after the array, is refused rather than dropped.
n_vocab = 1 + max(max(json.load(open(tok, encoding="utf-8"))["model"]["vocab"].values()),
                  *(t["id"] for t in json.load(open(tok, encoding="utf-8"))["added_tokens"]))
p = run("detokenize", f"[{n_vocab - 1}]\n")
if p.returncode != 0:
    fail(f"the last id {n_vocab - 1} refused: " + p.stderr.decode())
p = run("detokenize", f"[1]\n[1, {n_vocab}]\n")
if p.returncode == 0 or f"<stdin>:2: element 1: id {n_vocab} is outside".encode() not in p.stderr:
    fail(f"id {n_vocab} past the vocabulary not reported: " + p.stderr.decode())
p = run("detokenize", "[1, 2] 3\n")
if p.returncode == 0 or b"<stdin>:1" not in p.stderr:
    fail("text after the array not reported: " + p.stderr.decode())
p = subprocess.run([dsquant, "tokenize", "--tokenizer", "/nonexistent/tokenizer.json"],
                   input=b"", capture_output=True)
if p.returncode == 0 or b"/nonexistent/tokenizer.json" not in p.stderr:
    fail("missing tokenizer not reported: " + p.stderr.decode())
for cmd in ("tokenize", "detokenize"):
    p = subprocess.run([dsquant, cmd, "--help"], capture_output=True)
    if p.returncode != 0 or b"--tokenizer" not in p.stdout:
        fail(cmd + " --help")
print(f"dsquant tokenize/detokenize: {len(cases)}/{len(cases)} cases match ({os.path.basename(tok)})")
