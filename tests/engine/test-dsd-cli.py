#!/usr/bin/env python3
"""dsd --generate on the embedded synthetic model: the documented command-line surface,
determinism of greedy and seeded sampling, and clear errors for bad input, in --generate
and in serving mode."""
import os
import re
import subprocess
import sys

dsd = os.environ["DSD"]
model = os.path.join(os.environ["DSD_BUILD"], "models", "tiny")
failures = 0
checks = 0


def run(*args):
    return subprocess.run([dsd, *args], capture_output=True)


def check(cond, what):
    global failures, checks
    checks += 1
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures += 1


def summary(p):
    m = re.search(rb"(\d+) prompt tokens .* (\d+) generated tokens, [\d.]+ tokens/s, finish (\w+)",
                  p.stderr)
    return (int(m.group(1)), int(m.group(2)), m.group(3).decode()) if m else None


p = run("--help")
check(p.returncode == 0 and b"--generate" in p.stdout and b"--max-tokens" in p.stdout,
      "--help exits 0 and documents the options")
check(b"--lm-head-int8" in p.stdout and b"8 bits" in p.stdout, "--help documents --lm-head-int8")

p = run("--model", model, "--generate", "Hello world", "--max-tokens", "16")
s = summary(p)
check(p.returncode == 0 and s is not None, "greedy generation runs and prints a summary")
check(s is not None and (s[1] == 16 if s[2] == "length" else s[1] < 16),
      f"--max-tokens 16 bounds the output ({s})")
check(b"\n" not in p.stderr.strip().split(b"\n")[-1] and p.stdout.count(b"dsd:") == 0,
      "stdout holds only generated text")

q = run("--model", model, "--generate", "Hello world", "--max-tokens", "16")
check(q.returncode == 0 and q.stdout == p.stdout, "greedy output is deterministic")
check(b", lm_head int8" not in q.stderr, "without --lm-head-int8 the summary names no int8 head")

# The synthetic model's lm_head (hidden 256) in groups of 128; its random weights give
# text of no meaning, so only the summary line is checked.
q = run("--model", model, "--generate", "Hello world", "--max-tokens", "4", "--lm-head-int8")
check(q.returncode == 0 and b", lm_head int8 g128," in q.stderr,
      f"--lm-head-int8 loads the lm_head as 8 bits ({q.stderr[-200:]!r})")

a = run("--model", model, "--generate", "Hello", "--temperature", "1", "--seed", "7",
        "--max-tokens", "32")
b = run("--model", model, "--generate", "Hello", "--temperature", "1", "--seed", "7",
        "--max-tokens", "32")
c = run("--model", model, "--generate", "Hello", "--temperature", "1", "--seed", "8",
        "--max-tokens", "32")
check(a.returncode == 0 and a.stdout == b.stdout, "same seed, same sampled text")
check(c.returncode == 0 and a.stdout != c.stdout, "another seed, another sampled text")

p = run("--model", model, "--generate", "Hi", "--chat", "--max-tokens", "8")
s = summary(p)
check(p.returncode == 0 and s is not None and s[0] > 3,
      f"--chat wraps the prompt in the ChatML template ({s})")

p = run("--model", model + "-missing", "--generate", "x")
check(p.returncode == 1 and (model + "-missing").encode() in p.stderr,
      "a missing model directory is named in the error")

p = run("--model", model, "--generate", "x", "--max-tokens", "lots")
check(p.returncode == 1 and b"--max-tokens" in p.stderr, "a bad option value names the option")

p = run("--model", model, "--generate", "x", "--bogus")
check(p.returncode == 1 and b"bogus" in p.stderr, "an unknown option is named")

p = run("--generate", "x")
check(p.returncode == 1 and b"--model" in p.stderr, "--generate without --model names --model")

p = run("--model", model, "--generate", "many words " * 2000, "--max-tokens", "4")
check(p.returncode == 1 and b"context" in p.stderr,
      "a prompt longer than the context is rejected, not cut")

p = run("--model", model, "--generate", "x", "--backend", "nonesuch")
check(p.returncode == 1 and b"nonesuch" in p.stderr, "an unknown backend is named")

# Each mode refuses the other's options instead of ignoring them, even well-formed ones.
for flag in (["--max-batch", "12abc"], ["--max-batch", "4"], ["--config", "/nonexistent"],
             ["--socket", "/tmp/x.sock"], ["--http-listen", "127.0.0.1:1"]):
    p = run("--model", model, "--generate", "x", "--max-tokens", "2", *flag)
    check(p.returncode == 1 and flag[0].encode() + b" is a serving option" in p.stderr,
          f"--generate refuses {flag[0]}: {p.stderr[-120:]!r}")
for flag in (["--max-tokens", "5"], ["--temperature", "1"], ["--seed", "3"], ["--chat"]):
    p = subprocess.run([dsd, "--model", model, *flag], capture_output=True, timeout=30)
    check(p.returncode == 1 and flag[0].encode() + b" applies only with --generate" in p.stderr,
          f"serving refuses {flag[0]}: {p.stderr[-120:]!r}")

# The flags shared with serving are checked as dsd.json's fields are, in --generate too.
for flag, field in ((["--device", "7x"], b"'device'"), (["--log-level", "loud"], b"'log_level'"),
                    (["--device", "256"], b"'device'")):
    p = run("--model", model, "--generate", "x", "--max-tokens", "2", *flag)
    check(p.returncode == 1 and field in p.stderr, f"--generate checks {flag}: {p.stderr!r}")
p = run("--model", model, "--generate", "x", "--max-tokens", "2", "--log-level", "error",
        "--backend", "cpu", "--device", "3")
check(p.returncode == 0 and summary(p) is not None,
      f"--generate takes --log-level, --backend and --device ({p.stderr[-200:]!r})")

p = run("--model", model, "--generate", "x", "--seed", "99999999999")
check(p.returncode == 1 and b"[0, 4294967295]" in p.stderr,
      f"an out-of-range number is called out of range ({p.stderr!r})")

# 0 is refused, not taken as the default, as dsd.json refuses 0 for its counts and times.
p = run("--model", model, "--generate", "x", "--max-tokens", "2", "--threads", "0")
check(p.returncode == 1 and b"--threads: '0' is not an integer in [1, " in p.stderr,
      f"--generate refuses --threads 0 ({p.stderr!r})")
for flag in ("--threads", "--step-tokens", "--slow-timeout-ms", "--max-clients"):
    p = subprocess.run([dsd, "--model", model, "--socket", "/nonexistent/dsd.sock", flag, "0"],
                       capture_output=True, timeout=30)
    check(p.returncode == 1 and flag.encode() + b": '0' is not an integer in [1, " in p.stderr,
          f"serving refuses {flag} 0 ({p.stderr!r})")

# The "http" object is checked before anything serves, its message said once.
p = subprocess.run([dsd, "--model", model, "--socket", "/nonexistent/dsd.sock", "--http-config",
                    '{"listen": "127.0.0.1:0", "max_body_byte": 4096}'],
                   capture_output=True, timeout=30)
check(p.returncode == 1 and b"--http-config: field 'http.max_body_byte' is not a known field"
      in p.stderr, f"a misspelt http field is refused, naming it ({p.stderr!r})")

print(f"{checks - failures} passed, {failures} failed")
sys.exit(1 if failures else 0)
