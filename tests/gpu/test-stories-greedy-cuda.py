#!/usr/bin/env python3
"""stories260K (F32 weights, uploaded as FP16) through `dsd --backend cuda --generate`
against llama2.c's greedy texts in shared/models/stories260K/greedy.json. Every prompt's
outcome is printed (bytes identical, or the byte and token where the texts part, with the
CPU backend's text checked at the same point) and every prompt must match: no near-tie
allowance is taken, since the texts carry no logits to show that one was a tie.

The daemons run side by side, each prompt twice (COPIES): a load whose copies were not
ordered with a legacy-stream memset once zeroed weights only when other processes shared
the GPU, so concurrent runs are part of what is checked."""
import json
import os
import subprocess
import sys
import tempfile

shared = os.environ["DSD_SHARED"]
dsquant = os.environ["DSQUANT"]
dsd = os.environ["DSD"]
src = os.path.join(shared, "models", "stories260K")
STEPS = 256
COPIES = 2

with tempfile.TemporaryDirectory() as out:
    model = os.path.join(out, "stories260K")
    subprocess.run([dsquant, "convert", "--from", "llama2c",
                    os.path.join(src, "stories260K.bin"), os.path.join(src, "tok512.bin"),
                    model], check=True, capture_output=True)
    cases = json.load(open(os.path.join(src, "greedy.json"), encoding="utf-8"))
    same = 0
    diffs = []
    runs = []
    for case in cases:
        prompt = case["prompt"]
        ids = subprocess.run([dsquant, "tokenize", "--tokenizer",
                              os.path.join(model, "tokenizer.json")],
                             input=json.dumps(prompt) + "\n", capture_output=True,
                             text=True, check=True).stdout
        n_prompt = len(json.loads(ids)) + 1
        for _ in range(COPIES):
            runs.append((case, n_prompt, subprocess.Popen(
                [dsd, "--backend", "cuda", "--model", model, "--generate", prompt,
                 "--max-tokens", str(STEPS + 1 - n_prompt)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
    for case, n_prompt, proc in runs:
        prompt = case["prompt"]
        stdout, stderr = proc.communicate()
        p = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
        if p.returncode != 0 and b"not available" in p.stderr:
            print("SKIP: no CUDA backend on this machine")
            sys.exit(77)
        if p.returncode != 0:
            sys.stderr.write(p.stderr.decode(errors="replace"))
            sys.exit(1)
        got = prompt.encode() + p.stdout + b"\n"
        want = case["text"].encode()
        if got == want:
            same += 1
            print(f"ok   prompt {prompt!r}: {len(want)} bytes identical")
            continue
        at = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]),
                  min(len(got), len(want)))
        tok = len(subprocess.run([dsquant, "tokenize", "--tokenizer",
                                  os.path.join(model, "tokenizer.json")],
                                 input=json.dumps(want[:at].decode(errors="ignore")) + "\n",
                                 capture_output=True, text=True, check=True).stdout.split(","))
        c = subprocess.run([dsd, "--backend", "cpu", "--model", model, "--generate", prompt,
                            "--max-tokens", str(STEPS + 1 - n_prompt)], capture_output=True)
        cpu = prompt.encode() + c.stdout + b"\n"
        print(f"DIFF prompt {prompt!r}: first difference at byte {at} (about token {tok}); "
              f"the CPU backend's text {'matches' if cpu == want else 'differs too'}\n"
              f"  want ...{want[max(0, at - 40):at + 40]!r}\n"
              f"  got  ...{got[max(0, at - 40):at + 40]!r}")
        diffs.append(tok)
    print(f"{same} of {len(runs)} runs identical"
          + (f"; first differing tokens {diffs}" if diffs else ""))
    sys.exit(0 if same == len(runs) else 1)
