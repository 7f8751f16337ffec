#!/usr/bin/env python3
"""A full queue answers 'busy' at once and an over-long prompt 'prompt too long', each
with a message naming the limit; the welcome reports the queue bound the scheduler
applies, its default (256) for --queue 0."""
import json
import subprocess

from serve_common import DSCTL, TOOL, Daemon, fail, run, wait_idle

DS_ERR_PROMPT_TOO_LONG = -(8192 + 2)


def main(tmp, model):
    d = Daemon(tmp, model, "--max-batch", "1", "--queue", "2")
    try:
        p = subprocess.run([TOOL, "flood", d.sock, "16", "300"], capture_output=True, text=True,
                           timeout=120)
        if p.returncode != 0:
            fail(f"serve-tool flood failed: {p.stderr}")
        res = json.loads(p.stdout)
        print(f"flood: {res}")
        if res["busy"] < 1 or res["finals"] < 1 or res["other"]:
            fail("expected some finished and some busy requests, nothing else")
        if "2" not in res["busy_message"]:
            fail(f"the busy message does not name the queue limit: {res['busy_message']!r}")

        info = d.info()
        if info["max_queue"] != 2:
            fail(f"the welcome reports a queue of {info['max_queue']}, not --queue's 2")
        p = subprocess.run([TOOL, "long", d.sock, str(info["context"] + 100)],
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            fail(f"serve-tool long failed: {p.stderr}")
        code, msg = p.stdout.strip().split(" ", 1)
        print(f"long prompt: {code} {msg}")
        if int(code) != DS_ERR_PROMPT_TOO_LONG or "prompt too long" not in msg or \
                str(info["context"]) not in msg:
            fail("the long prompt was not refused as too long with the context limit")
        # dsctl generate prints the daemon's message, which names the error once.
        p = subprocess.run([DSCTL, "generate", "--socket", d.sock, "Once upon a time " *
                            info["context"]], capture_output=True, text=True, timeout=60)
        print(f"dsctl generate, long prompt: rc={p.returncode} {p.stderr.strip()!r}")
        if p.returncode != 1 or p.stderr.lower().count("too long") != 1:
            fail("dsctl generate does not name 'prompt too long' exactly once")
        info = wait_idle(d)
        if info["active"] or info["kv_free"] != info["kv_total"]:
            fail(f"requests or KV blocks are left behind: {info}")
    finally:
        rc = d.stop()
    if rc != 0:
        fail(f"the daemon exited with {rc}\n{d.text()}")

    d = Daemon(tmp, model, "--queue", "0")
    try:
        info = d.info()
        print(f"--queue 0: {info}")
        if info["max_queue"] != 256:
            fail(f"with --queue 0 the welcome reports a queue of {info['max_queue']}, not 256")
    finally:
        rc = d.stop()
    if rc != 0:
        fail(f"the daemon with --queue 0 exited with {rc}\n{d.text()}")
    print("ok")
    return 0


run(main)
