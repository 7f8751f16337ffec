#!/usr/bin/env python3
"""stories260K converted by `dsquant convert` must reproduce llama2.c's greedy texts
(shared/models/stories260K/greedy.json) byte for byte through `dsd --generate`."""
import json
import os
import subprocess
import sys
import tempfile

shared = os.environ["DSD_SHARED"]
dsquant = os.environ["DSQUANT"]
dsd = os.environ["DSD"]
src = os.path.join(shared, "models", "stories260K")

# run.c -n 256: positions 0..255 are fed, and the token sampled at the last one is
# printed too, so a prompt of n ids (BOS included) gets 257 - n new tokens at most.
STEPS = 256

with tempfile.TemporaryDirectory() as out:
    model = os.path.join(out, "stories260K")
    subprocess.run([dsquant, "convert", "--from", "llama2c",
                    os.path.join(src, "stories260K.bin"), os.path.join(src, "tok512.bin"),
                    model], check=True)
    cases = json.load(open(os.path.join(src, "greedy.json"), encoding="utf-8"))
    failed = 0
    for case in cases:
        prompt = case["prompt"]
        ids = subprocess.run([dsquant, "tokenize", "--tokenizer",
                              os.path.join(model, "tokenizer.json")],
                             input=json.dumps(prompt) + "\n", capture_output=True,
                             text=True, check=True).stdout
        n_prompt = len(json.loads(ids)) + 1
        p = subprocess.run([dsd, "--model", model, "--generate", prompt,
                            "--max-tokens", str(STEPS + 1 - n_prompt)],
                           capture_output=True, check=True)
        got = prompt.encode() + p.stdout + b"\n"
        want = case["text"].encode()
        if got != want:
            failed += 1
            at = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]),
                      min(len(got), len(want)))
            print(f"FAIL prompt {prompt!r}: first difference at byte {at}\n"
                  f"  want ...{want[max(0, at - 40):at + 40]!r}\n"
                  f"  got  ...{got[max(0, at - 40):at + 40]!r}")
        else:
            print(f"ok   prompt {prompt!r}: {len(want)} bytes identical")
        sys.stderr.write(p.stderr.decode(errors="replace").splitlines()[-1] + "\n")
    print(f"{len(cases) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
