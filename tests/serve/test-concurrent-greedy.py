#!/usr/bin/env python3
"""32 concurrent `dsctl generate` processes (greedy; greedy.json's prompts and variants of
them): each output is byte-identical to the same prompt run alone by `dsd --generate`."""
import subprocess
import sys

from serve_common import DSD, DSCTL, Daemon, greedy_prompts, run, wait_idle

N = 32
MAX_TOKENS = 200
SUFFIXES = ["", " there", " the", " a", " Lily", " Tom", " big", " little", " dog", " cat",
            " sun"]


def main(tmp, model):
    base = [p for p in greedy_prompts() if p] + ["One day"]
    prompts = [base[i % len(base)] + SUFFIXES[i // len(base) % len(SUFFIXES)]
               for i in range(N)]
    want = [subprocess.run([DSD, "--model", model, "--backend", "cpu", "--generate", p,
                            "--max-tokens", str(MAX_TOKENS)], capture_output=True,
                           check=True).stdout for p in prompts]
    d = Daemon(tmp, model)
    try:
        procs = [subprocess.Popen([DSCTL, "generate", "--socket", d.sock, "--max-tokens",
                                   str(MAX_TOKENS), p], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE) for p in prompts]
        failed = 0
        for p, prompt, w in zip(procs, prompts, want):
            out, err = p.communicate(timeout=300)
            if p.returncode != 0 or out != w:
                failed += 1
                print(f"FAIL {prompt!r}: rc {p.returncode}, {len(out)} bytes vs {len(w)}; "
                      f"{err.decode(errors='replace').strip()}")
            else:
                print(f"ok   {prompt!r}: {len(out)} bytes identical")
        info = wait_idle(d)
        print(f"after: {info}")
        if info["active"] or info["kv_free"] != info["kv_total"]:
            failed += 1
            print("FAIL: requests or KV blocks left behind")
    finally:
        rc = d.stop()
    if rc != 0:
        print(f"FAIL: the daemon exited with {rc}\n{d.text()}")
        failed += 1
    print(f"{N - failed} passed, {failed} failed")
    return 1 if failed else 0


run(main)
