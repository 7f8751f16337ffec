#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The serving and management paths with DeepSeek MoE + MLA models (issue 6, must-show 5),
against a real dsd on a private dbus-daemon, driven by dsctl:

  1. dsd serves the synthetic tiny-moe checkpoint: `dsctl generate` (greedy) is
     byte-identical to `dsd --generate`, also for several concurrent clients;
  2. `dsctl status` and the D-Bus properties name the model and its architecture, and
     KVBytesPerToken is layers × (kv_lora_rank + qk_rope_head_dim) × 4 (MLA's latent
     cache in float32), computed here from config.json;
  3. `dsctl reload` switches MoE → dense and dense → MoE (the V2 fixture) while a stream
     runs: the stream finishes on the old model with its --generate text, new requests
     get the new model's, status follows; then V2 → V3 → tiny-moe with the daemon idle;
     reloads to a V3 copy without an expert tensor and to a tiny-moe copy cut inside an
     expert tensor fail naming the tensor, and tiny-moe keeps serving;
  4. drain and resume with tiny-moe loaded, a stream running across the drain.

    test-moe-serve.py TINY_MOE_DIR   (DSD_SHARED, DSD_BUILD, DSD ... from meson)

The fixtures have no tokenizer; each is served from a directory of links to its weights
and tiny-moe's tokenizer (512 ids, fewer than the fixtures' 1024: the rest are padding
rows, which dsd allows).
"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.environ["DSD_SOURCE"], "tests", "serve"))
sys.path.insert(0, os.path.join(os.environ["DSD_SOURCE"], "tests", "service"))
import serve_common as sc  # noqa: E402
from service_common import (check, failures, generate, kill_all, private_bus,  # noqa: E402
                            start, started)

DSD, DSCTL, TOOL, BUILD = sc.DSD, sc.DSCTL, sc.TOOL, sc.BUILD
DENSE = os.path.join(BUILD, "models", "tiny")
DS_ERR_DRAINING = -(8192 + 12)
BUS_NAME, BUS_PATH = "io.dsd.Daemon1", "/io/dsd/Daemon1"

STREAM_PROMPT = "Once upon a time"
# Token counts are small: the ASan build (-O0) decodes these models at 3-12 tokens/s.
# At STREAM_DELAY_MS a read, a stream outlasts a reload of these tiny models (tens of ms).
STREAM_TOKENS = 64
STREAM_DELAY_MS = "25"
NEW_PROMPT = "The little dog"
NEW_TOKENS = 16
CONCURRENT = ["One day", "A cat sat", "The sun", "Hello there"]


def config(model):
    with open(os.path.join(model, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def kv_bytes_per_token(model):
    """What the CPU backend keeps per position, from config.json: MLA caches the latent
    and the shared rope key; the others K and V of every KV head; all float32."""
    c = config(model)
    if "kv_lora_rank" in c:
        per_layer = c["kv_lora_rank"] + c["qk_rope_head_dim"]
    else:
        head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        per_layer = 2 * c["num_key_value_heads"] * head_dim
    return c["num_hidden_layers"] * per_layer * 4


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def served_dir(tmp, name, weights, tokenizer_from):
    """A model directory: weights' config.json and model.safetensors, tokenizer_from's
    tokenizer."""
    d = os.path.join(tmp, name)
    os.mkdir(d)
    for f in ("config.json", "model.safetensors"):
        os.symlink(os.path.join(weights, f), os.path.join(d, f))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        os.symlink(os.path.join(tokenizer_from, f), os.path.join(d, f))
    return d


def without_tensor(tmp, name, src, tensor):
    """src with tensor renamed away in the safetensors header; the data as it is."""
    d = os.path.join(tmp, name)
    os.mkdir(d)
    header, data = read_safetensors(os.path.join(src, "model.safetensors"))
    header[tensor.replace(".experts.", ".expert.")] = header.pop(tensor)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        os.symlink(os.path.realpath(os.path.join(src, f)), os.path.join(d, f))
    return d


def cut_inside(tmp, name, src, tensor):
    """src's model.safetensors cut 100 bytes into tensor's data, as an interrupted copy."""
    d = os.path.join(tmp, name)
    os.mkdir(d)
    path = os.path.join(src, "model.safetensors")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    begin, end = header[tensor]["data_offsets"]
    if end - begin <= 100:
        sc.fail(f"{tensor} holds only {end - begin} bytes; cut another tensor")
    with open(path, "rb") as f:
        head = f.read(8 + n + begin + 100)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(head)
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        os.symlink(os.path.join(src, f), os.path.join(d, f))
    return d


class Dsd:
    """dsd --config CONFIG; stderr goes to a log file."""

    def __init__(self, tmp, config, env):
        self.log_path = os.path.join(tmp, "dsd.log")
        self.log = open(self.log_path, "wb")
        self.proc = start([DSD, "--config", config], env=env, stderr=self.log,
                          stdout=subprocess.DEVNULL)

    def text(self):
        self.log.flush()
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()


def main(tmp, moe):
    if not shutil.which("dbus-daemon"):
        sc.skip("dbus-daemon is not installed (tools/install-deps.sh installs it)")
    fixtures = os.path.join(sc.SHARED, "fixtures")
    v2_src = os.path.join(fixtures, "tiny-deepseek-v2-awq")
    v3_src = os.path.join(fixtures, "tiny-deepseek-v3-awq")
    for d in (moe, DENSE, v2_src, v3_src):
        if not os.path.isfile(os.path.join(d, "config.json")):
            sc.fail(f"{d} is missing (build the tree; DSD_SHARED must hold the fixtures)")
    os.chmod(tmp, 0o755)
    v2 = served_dir(tmp, "tiny-deepseek-v2", v2_src, moe)
    v3 = served_dir(tmp, "tiny-deepseek-v3", v3_src, moe)
    gone = "model.layers.2.mlp.experts.7.up_proj.qweight"
    no_expert = without_tensor(tmp, "v3-no-expert", v3, gone)
    cut = "model.layers.2.mlp.experts.6.gate_proj.qweight"
    truncated = cut_inside(tmp, "moe-truncated", moe, cut)
    broken = [(no_expert, f"'{gone}' is missing"), (truncated, f"'{cut}'")]

    arch = {m: config(m)["architectures"][0] for m in (moe, DENSE, v2, v3)}
    check(arch[moe] == arch[v2] == "DeepseekV2ForCausalLM"
          and arch[v3] == "DeepseekV3ForCausalLM", f"unexpected architectures {arch}")
    kv = {m: kv_bytes_per_token(m) for m in (moe, DENSE, v2, v3)}
    print("KV bytes per token from config.json:", {os.path.basename(m): v for m, v in kv.items()})

    want_stream = {m: generate(m, STREAM_PROMPT, STREAM_TOKENS) for m in (moe, DENSE)}
    want_new = {m: generate(m, NEW_PROMPT, NEW_TOKENS) for m in (moe, DENSE, v2, v3)}
    want_many = [generate(moe, p, NEW_TOKENS) for p in CONCURRENT]

    _, env = private_bus(tmp)
    address = env["DBUS_SESSION_BUS_ADDRESS"]
    sock = os.path.join(tmp, "dsd.sock")
    cfg = os.path.join(tmp, "dsd.json")
    with open(cfg, "w", encoding="utf-8") as f:
        json.dump(dict(model=moe, backend="cpu", bus="session", log_level="info",
                       stop_timeout_sec=60,
                       limits=dict(kv_memory_fraction=0.02, max_batch=16,
                                   client_max_pending_events=16),
                       socket=dict(path=sock, mode="0666")), f)

    def dsctl(*args, timeout=60):
        """A reload of these models takes a second or two even under ASan: one that has
        not replied in 60 s hangs."""
        cmd = [DSCTL, "--user", *args]
        try:
            return subprocess.run(cmd, capture_output=True, text=True, env=env,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(cmd, -1, "", f"no answer in {timeout} s")

    def status():
        r = dsctl("status", "--json")
        return json.loads(r.stdout) if r.returncode == 0 else {"rc": r.returncode,
                                                                "err": r.stderr}

    def wait_ready(timeout=120):
        deadline = time.monotonic() + timeout
        st = {}
        while time.monotonic() < deadline:
            st = status()
            if st.get("State") == "ready":
                break
            time.sleep(0.1)
        return st

    def client_generate(prompt, n=NEW_TOKENS):
        return subprocess.run([DSCTL, "generate", "--socket", sock, "--max-tokens", str(n),
                               prompt], capture_output=True, timeout=300)

    def check_serves(model, when):
        st = status()
        check(st.get("State") == "ready" and st.get("Model") == model
              and st.get("Architecture") == arch[model]
              and st.get("KVBytesPerToken") == kv[model] and st.get("Backend") == "cpu",
              f"{when}: status {st}, expected {model} ({arch[model]}, {kv[model]} B/token)")
        p = client_generate(NEW_PROMPT)
        check(p.returncode == 0 and p.stdout == want_new[model],
              f"{when}: dsctl generate is not {os.path.basename(model)}'s --generate text: "
              f"rc={p.returncode} {p.stdout!r} != {want_new[model]!r} {p.stderr!r}")

    def reload_during_stream(old, new):
        stream = start([TOOL, "stream", sock, STREAM_PROMPT, str(STREAM_TOKENS), STREAM_DELAY_MS],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        check(started(stream), f"the stream on {old} did not start\n{d.text()}")
        r = dsctl("reload", new)
        check(r.returncode == 0, f"dsctl reload {new}: rc={r.returncode} {r.stderr}")
        check(stream.poll() is None, f"the stream on {old} ended before the reload to {new} "
              "completed; the test proves nothing about finishing on the old model")
        check_serves(new, f"after the reload {os.path.basename(old)} → {os.path.basename(new)}")
        out, err = stream.communicate(timeout=300)
        check(stream.returncode == 0 and b"final" in err,
              f"the stream on {old} did not finish: rc={stream.returncode} {err!r}")
        check(out == want_stream[old], f"the stream across the reload is not "
              f"{os.path.basename(old)}'s --generate text:\n{out!r}\n{want_stream[old]!r}")

    d = Dsd(tmp, cfg, env)
    try:
        # --- 1 and 2: serving tiny-moe; status and the properties.
        st = wait_ready()
        check(st.get("State") == "ready", f"dsd did not get ready: {st}\n{d.text()}")
        check_serves(moe, "after start")
        human = dsctl("status")
        check(human.returncode == 0 and f"{moe} ({arch[moe]})" in human.stdout
              and f"{kv[moe]} bytes per token" in human.stdout,
              f"dsctl status lacks the model, architecture or KV size:\n{human.stdout}")
        print(human.stdout, end="")
        if shutil.which("busctl"):
            for name, sig, want in (("Architecture", "s", f'"{arch[moe]}"'),
                                    ("KVBytesPerToken", "t", str(kv[moe]))):
                r = subprocess.run(["busctl", "--address=" + address, "get-property",
                                    BUS_NAME, BUS_PATH, BUS_NAME, name],
                                   capture_output=True, text=True, timeout=60)
                check(r.stdout.strip() == f"{sig} {want}",
                      f"busctl get-property {name}: {r.stdout!r} {r.stderr!r}")
        many = [start([DSCTL, "generate", "--socket", sock, "--max-tokens", str(NEW_TOKENS), p],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE) for p in CONCURRENT]
        for p, prompt, want in zip(many, CONCURRENT, want_many):
            out, err = p.communicate(timeout=300)
            check(p.returncode == 0 and out == want,
                  f"concurrent {prompt!r}: rc={p.returncode} {out!r} != {want!r} {err!r}")

        # --- 3: MoE → dense and dense → MoE during a stream, MoE → MoE, broken MoE.
        reload_during_stream(moe, DENSE)
        reload_during_stream(DENSE, v2)
        for model in (v3, moe):
            r = dsctl("reload", model)
            check(r.returncode == 0, f"dsctl reload {model}: {r.stderr}")
            check_serves(model, f"after the reload to {os.path.basename(model)}")
        for model, detail in broken:
            r = dsctl("reload", model)
            file = os.path.join(model, "model.safetensors")
            check(r.returncode == 1 and detail in r.stderr and file in r.stderr,
                  f"reload to {model}: rc={r.returncode}, message lacks {file!r} or "
                  f"{detail!r}: {r.stderr!r}")
            print(f"reload {os.path.basename(model)}: {r.stderr.strip()}")
            check_serves(moe, f"after the failed reload to {os.path.basename(model)}")
        check(d.text().count("the previous model keeps serving") == len(broken),
              "the log does not say the previous model keeps serving after each failure")

        # --- 4: drain and resume on tiny-moe, a stream running across the drain.
        stream = start([TOOL, "stream", sock, STREAM_PROMPT, str(STREAM_TOKENS), STREAM_DELAY_MS],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        check(started(stream), f"the stream before the drain did not start\n{d.text()}")
        r = dsctl("drain")
        check(r.returncode == 0, f"dsctl drain: {r.stderr}")
        check(stream.poll() is None, "the stream ended before the drain; the test proves "
              "nothing about requests in flight finishing")
        st = status()
        check(st.get("State") == "draining" and st.get("Architecture") == arch[moe]
              and st.get("KVBytesPerToken") == kv[moe], f"status while draining: {st}")
        late = subprocess.run([TOOL, "stream", sock, NEW_PROMPT, "4", "0"],
                              capture_output=True, text=True, timeout=120)
        check(f"error {DS_ERR_DRAINING}" in late.stderr,
              f"a request during the drain was not refused 'draining': {late.stderr!r}")
        p = client_generate(NEW_PROMPT)
        check(p.returncode == 1 and b"draining" in p.stderr,
              f"dsctl generate during the drain: rc={p.returncode} {p.stderr!r}")
        out, err = stream.communicate(timeout=300)
        check(stream.returncode == 0 and b"final" in err and out == want_stream[moe],
              f"the stream across the drain: rc={stream.returncode} {err!r}, "
              f"text equal: {out == want_stream[moe]}")
        r = dsctl("resume")
        check(r.returncode == 0, f"dsctl resume: {r.stderr}")
        check_serves(moe, "after resume")

        d.proc.send_signal(signal.SIGTERM)
        rc = d.proc.wait(120)
        check(rc == 0, f"dsd exited {rc} after SIGTERM\n{d.text()[-3000:]}")
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
    if failures:
        print(d.text()[-4000:])
    return 1 if failures else 0


def run():
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rc = main(tmp, os.path.abspath(sys.argv[1]))
    finally:
        kill_all()
    print(f"{len(failures)} failures" if failures else "all checks passed")
    sys.exit(rc)


if __name__ == "__main__":
    run()
