#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""dsquant inspect against every malformed checkpoint of corpus/ (made by mkcorpus.py):
each must exit non-zero, not by a signal (a crash or a sanitizer abort), with an error that
names the offending file and the tensor or field that MANIFEST gives. Then inspect must
succeed on each real fixture of shared/fixtures.

    test-inspect-corpus.py DSQUANT CORPUS_DIR   (DSD_SHARED from the environment)
"""
import os
import subprocess
import sys

FIXTURES = ["tiny-llama-awq", "tiny-qwen2-awq", "tiny-llama-awq-sharded"]


def run(dsquant, model):
    return subprocess.run([dsquant, "inspect", "--model", model], capture_output=True,
                          text=True, errors="replace", timeout=60)


def main():
    dsquant, corpus = sys.argv[1], sys.argv[2]
    shared = os.environ.get("DSD_SHARED")
    if not shared:
        print("DSD_SHARED is not set; run through 'meson test'")
        return 1
    failures = []
    cases = []
    with open(os.path.join(corpus, "MANIFEST")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, file, detail = line.rstrip("\n").split("\t")
            cases.append((name, file, detail))
    listed = {c[0] for c in cases}
    on_disk = {d for d in os.listdir(corpus) if os.path.isdir(os.path.join(corpus, d))}
    if listed != on_disk:
        failures.append(f"MANIFEST and corpus/ disagree: {sorted(listed ^ on_disk)}")

    for name, file, detail in cases:
        p = run(dsquant, os.path.join(corpus, name))
        err = p.stderr.strip()
        if p.returncode < 0:
            failures.append(f"{name}: killed by signal {-p.returncode}: {err}")
        elif p.returncode == 0:
            failures.append(f"{name}: exit status 0, expected a failure")
        elif os.path.join(name, file) not in err:
            failures.append(f"{name}: message does not name {name}/{file}: {err}")
        elif detail not in err:
            failures.append(f"{name}: message does not contain {detail!r}: {err}")
        elif "AddressSanitizer" in err or "runtime error" in err:
            failures.append(f"{name}: sanitizer report: {err}")
        else:
            print(f"ok {name}: {err}")

    for fx in FIXTURES:
        p = run(dsquant, os.path.join(shared, "fixtures", fx))
        if p.returncode != 0 or p.stderr:
            failures.append(f"{fx}: inspect failed ({p.returncode}): {p.stderr.strip()}")
        elif "architecture:" not in p.stdout or "kinds:" not in p.stdout:
            failures.append(f"{fx}: summary is incomplete:\n{p.stdout}")
        else:
            print(f"ok fixture {fx}")

    p = subprocess.run([dsquant, "inspect", "--help"], capture_output=True, text=True)
    if p.returncode != 0 or "--model DIR" not in p.stdout:
        failures.append(f"inspect --help: exit {p.returncode}: {p.stdout}{p.stderr}")
    p = subprocess.run([dsquant, "inspect", "--bogus"], capture_output=True, text=True)
    if p.returncode == 0 or "--bogus" not in p.stderr:
        failures.append(f"inspect --bogus: exit {p.returncode}: {p.stderr}")

    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
