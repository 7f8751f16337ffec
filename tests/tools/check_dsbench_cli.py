#!/usr/bin/env python3
"""dsbench's options: a bad number or range (a sign, overflow, text after it, MIN > MAX),
an unwritable --json file and, with --http, more prompt words than a request body holds
are refused before anything runs, naming the option or the file; good ranges drive a real
daemon on the embedded model (the most words that fit through its HTTP listener) and land
in the JSON."""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

dsbench, dsd = sys.argv[1], os.environ["DSD"]
model = os.path.join(os.environ["DSD_BUILD"], "models", "tiny")
failures = 0


def check(cond, what):
    global failures
    print(("ok   " if cond else "FAIL ") + what)
    failures += not cond


def run(*args, sock="/nonexistent/dsd.sock"):
    return subprocess.run([dsbench, "--socket", sock, "--rtt-rounds", "10", *args],
                          capture_output=True, timeout=120)


for opt, value in (("--prompt-words", "-3"), ("--prompt-words", "1000001"),
                   ("--max-tokens", "-5"), ("--max-tokens", "5:-1"), ("--max-tokens", "9:3"),
                   ("--max-tokens", "99999999999"), ("--max-tokens", "5:"),
                   ("--max-tokens", "+5"), ("--max-tokens", "4x"), ("--clients", "99999999999"),
                   ("--requests", "0"), ("--seed", "-1")):
    p = run(opt, value)
    check(p.returncode == 1 and f"dsbench: {opt}: '{value}'".encode() in p.stderr
          and not p.stdout, f"{opt} {value} is refused before the run: {p.stderr!r}")

# With --http the longest prompt must fit a 4096-byte request body: refused before the
# run, naming the option and how many words fit.
p = run("--http", "/nonexistent/h.sock", "--prompt-words", "10:600")
m = re.search(rb"at most (\d+) words fit", p.stderr)
fit = int(m.group(1)) if m else 0
check(p.returncode == 1 and p.stderr.startswith(b"dsbench: --prompt-words: ") and
      500 < fit < 600 and not p.stdout,
      f"--http with 600 prompt words is refused before the run: {p.stderr!r}")

# No daemon: the socket is named and nothing is measured or reported, from --socket and
# from $DSD_SOCKET alike; the --json file made before the check is removed again.
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "out.json")
    p = run("--json", out)
    check(p.returncode == 1 and b"'/nonexistent/dsd.sock'" in p.stderr and not p.stdout
          and not os.path.exists(out),
          f"no daemon at --socket: named, no report ({p.returncode}, {p.stderr!r}, "
          f"{p.stdout[:200]!r})")
p = subprocess.run([dsbench, "--rtt-rounds", "10"], capture_output=True, timeout=60,
                   env=dict(os.environ, DSD_SOCKET="/nonexistent/env.sock"))
check(p.returncode == 1 and b"'/nonexistent/env.sock'" in p.stderr and not p.stdout,
      f"no daemon at $DSD_SOCKET: named, no report ({p.returncode}, {p.stderr!r})")

with tempfile.TemporaryDirectory() as tmp:
    bad = os.path.join(tmp, "missing", "out.json")
    p = run("--json", bad)
    check(p.returncode == 1 and f"cannot create '{bad}'".encode() in p.stderr and not p.stdout,
          f"an unwritable --json file is refused before the run: {p.stderr!r}")

    sock = os.path.join(tmp, "dsd.sock")
    http = os.path.join(tmp, "h.sock")
    d = subprocess.Popen([dsd, "--model", model, "--socket", sock, "--http-listen", http],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        out = os.path.join(tmp, "out.json")
        p = run("--requests", "3", "--prompt-words", "0:3", "--max-tokens", "2:4", "--json", out,
                sock=sock)
        res = json.load(open(out)) if p.returncode == 0 else {}
        check(p.returncode == 0 and res.get("requests") == 3 and res.get("errors") == 0
              and res.get("prompt_words") == [0, 3] and res.get("max_tokens") == [2, 4]
              and 3 * 2 <= res.get("generated_tokens", 0) <= 3 * 4,
              f"good ranges run and are written to --json ({p.stderr!r}, {res})")
        # as many words as the refusal said fit go through the HTTP listener
        p = run("--http", http, "--requests", "2", "--prompt-words", str(fit),
                "--max-tokens", "2", "--json", out)
        res = json.load(open(out)) if p.returncode == 0 else {}
        check(p.returncode == 0 and res.get("requests") == 2 and res.get("errors") == 0,
              f"--http with {fit} prompt words runs ({p.returncode}, {p.stderr!r}, {res})")
    finally:
        d.terminate()
        d.wait(timeout=60)

print(f"{failures} failed")
sys.exit(1 if failures else 0)
