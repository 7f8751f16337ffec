#!/usr/bin/env python3
"""dsd as a service, end to end (issue 4's "must show" 1-4 and 6):

On a private dbus-daemon with dsd --config ... --bus session serving stories260K (converted
with dsquant) and the synthetic tiny model as the reload target:
  1. dsctl --user status --json says ready and names the model; dsctl --user reload OTHER
     during a long streaming generation leaves that generation complete and byte-equal to
     dsd --generate, while a request started after the reload is answered by the new
     model (its text equals the tiny model's own --generate);
  3. configs with a wrong type, an unknown field and a missing model directory make dsd
     exit non-zero naming the field; the same files through Reload leave the old model
     serving;
  4. a mutating call from uid 65534 is refused AccessDenied (root and setpriv only);
  2. Drain while 8 requests stream: new requests get 'draining'; SIGTERM then lets all 8
     finish with a final event and dsd exits 0.
Then, without systemd (this container has no systemd as PID 1), the sd_notify protocol
against a fake NOTIFY_SOCKET: STATUS lines with layer progress before READY=1,
RELOADING=1 with MONOTONIC_USEC on SIGHUP then READY=1, WATCHDOG=1 pings that stop when
the engine loop is stalled (DSD_TEST_STALL_ENGINE_SEC, test-only), STOPPING=1 on SIGTERM.
"""
import http.client
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.environ["DSD_SOURCE"], "tests", "serve"))
import serve_common as sc  # noqa: E402
from service_common import (check, failures, generate, kill_all, private_bus,  # noqa: E402
                            start, started)

DSD, DSCTL, TOOL, BUILD = sc.DSD, sc.DSCTL, sc.TOOL, sc.BUILD
TINY = os.path.join(BUILD, "models", "tiny")
NOBODY = 65534
DS_ERR_DRAINING = -(8192 + 12)
LONG_PROMPT = "Once upon a time"
NEW_PROMPT = "The little dog"


class UnixHTTP(http.client.HTTPConnection):
    """http.client over the listener's Unix socket."""

    def __init__(self, path):
        super().__init__("localhost", timeout=30)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.unix_path)


def http_status(path, method, url, body=None):
    c = UnixHTTP(path)
    c.request(method, url, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def write_config(path, **fields):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(fields, f, indent=2)


class Dsd:
    def __init__(self, tmp, config, env, *args):
        self.log_path = os.path.join(tmp, "dsd.log")
        self.log = open(self.log_path, "ab")
        self.proc = start([DSD, "--config", config, *args], env=env, stderr=self.log,
                          stdout=subprocess.DEVNULL)

    def text(self):
        self.log.flush()
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def wait(self, timeout=60):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


def main(tmp, model_a):
    for tool in ("dbus-daemon",):
        if not shutil.which(tool):
            sc.skip(f"{tool} is not installed (tools/install-deps.sh installs it)")
    if not os.path.isdir(TINY):
        sc.skip(f"{TINY} is not built")
    os.chmod(tmp, 0o755)
    bus_sock, env = private_bus(tmp)
    os.chmod(bus_sock, 0o777)
    sock = os.path.join(tmp, "dsd.sock")
    http_sock = os.path.join(tmp, "http.sock")
    cfg = os.path.join(tmp, "dsd.json")
    good = dict(model=model_a, backend="cpu", bus="session", log_level="info",
                stop_timeout_sec=30,
                limits=dict(kv_memory_fraction=0.02, max_batch=16,
                            client_max_pending_events=16),
                socket=dict(path=sock, mode="0666"), http=dict(listen=http_sock))
    write_config(cfg, **good)

    def dsctl(*args, user=None):
        cmd = [DSCTL, "--user", *args]
        if user is not None:
            cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--"] + cmd
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)

    def status():
        r = dsctl("status", "--json")
        return json.loads(r.stdout) if r.returncode == 0 else {"rc": r.returncode,
                                                                "err": r.stderr}

    def wait_state(want, timeout=60):
        deadline = time.monotonic() + timeout
        st = {}
        while time.monotonic() < deadline:
            st = status()
            if st.get("State") == want:
                return st
            time.sleep(0.1)
        return st

    long_want = generate(model_a, LONG_PROMPT, 400)
    new_want = generate(TINY, NEW_PROMPT, 24)

    # --- 3a: bad configurations make dsd exit non-zero, naming the field.
    bad = {
        "wrong type": (dict(good, limits=dict(max_batch="sixteen")), "limits.max_batch"),
        "unknown field": (dict(good, bogus_field=1), "bogus_field"),
        "missing model": (dict(good, model=os.path.join(tmp, "no-such-model")), "model"),
    }
    for what, (fields, name) in bad.items():
        path = os.path.join(tmp, "bad.json")
        write_config(path, **fields)
        p = subprocess.run([DSD, "--config", path], capture_output=True, text=True, env=env,
                           timeout=60)
        check(p.returncode != 0 and f"'{name}'" in p.stderr,
              f"{what}: dsd should exit non-zero naming '{name}': rc={p.returncode} "
              f"{p.stderr!r}")
        if what == "wrong type":
            check(f"{path}:" in p.stderr, f"wrong type: no file position: {p.stderr!r}")

    # --- 1: status, and a reload during a long streaming generation.
    d = Dsd(tmp, cfg, env)
    try:
        st = wait_state("ready")
        check(st.get("State") == "ready" and st.get("Model") == model_a,
              f"status after start: {st}\n{d.text()}")
        stream = start([TOOL, "stream", sock, LONG_PROMPT, "400", "20"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        check(started(stream), f"the long stream did not start\n{d.text()}")
        r = dsctl("reload", TINY)
        check(r.returncode == 0, f"dsctl reload: rc={r.returncode} {r.stderr}")
        check(stream.poll() is None, "the long stream ended before the reload completed; "
              "the test proves nothing about finishing on the old model")
        st = status()
        check(st.get("State") == "ready" and st.get("Model") == TINY, f"status after reload: {st}")
        p = subprocess.run([DSCTL, "generate", "--socket", sock, "--max-tokens", "24",
                            NEW_PROMPT], capture_output=True, timeout=120)
        check(p.returncode == 0 and p.stdout == new_want,
              f"a request after the reload is not the new model's: {p.stdout!r} != {new_want!r}")
        out, err = stream.communicate(timeout=120)
        check(stream.returncode == 0 and b"final" in err,
              f"the long stream did not finish: rc={stream.returncode} {err!r}")
        check(out == long_want, f"the long stream's text differs from dsd --generate:\n"
              f"{out!r}\n{long_want!r}")
        time.sleep(0.3)
        check("previous model finished its last request" in d.text(),
              "the old engine was not freed once empty")

        # --- dsctl chat on the new model: two turns, Ctrl-C cancels an answer, not the
        # program, EOF exits 0.
        chat = start([DSCTL, "chat", "--socket", sock, "--max-tokens", "400"],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        chat.stdin.write(b"Hello there\n")
        chat.stdin.flush()
        if select.select([chat.stdout], [], [], 60)[0]:
            chat.send_signal(signal.SIGINT)
        out, err = chat.communicate(b"And again\n", timeout=120)
        check(chat.returncode == 0 and out.count(b"\n") >= 2,
              f"dsctl chat: rc={chat.returncode} out={out[-300:]!r} err={err!r}")
        print(f"dsctl chat: {len(out)} bytes, cancelled: {b'[cancelled]' in out}")

        # --- 3b: the same bad configs through Reload leave the new model serving.
        for what, (fields, name) in bad.items():
            write_config(cfg, **fields)
            r = dsctl("reload")
            check(r.returncode == 1 and name in r.stderr,
                  f"Reload with {what}: rc={r.returncode} {r.stderr!r}")
            check(f"Reload(): reload of '{cfg}' refused: " in d.text() and name in d.text(),
                  f"Reload with {what}: the refusal is not in dsd's log\n{d.text()[-2000:]}")
            st = status()
            check(st.get("State") == "ready" and st.get("Model") == TINY,
                  f"after a failed Reload ({what}): {st}")
        write_config(cfg, **good)
        # A model named by the caller that is a file, not a directory: refused, and logged in one
        # line with the path and the reason, as a SIGHUP reload's refusal is.
        missing = os.path.join(tmp, "not-a-model")
        with open(missing, "w", encoding="utf-8") as f:
            f.write("a file, not a model directory\n")
        r = dsctl("reload", missing)
        check(r.returncode == 1 and "not a directory" in r.stderr,
              f"Reload of a file: rc={r.returncode} {r.stderr!r}")
        lines = [l for l in d.text().splitlines()
                 if f"reload of '{missing}' refused:" in l and "not a directory" in l]
        check(len(lines) == 1, f"Reload of a file: {len(lines)} log lines naming "
              f"it, not 1\n{d.text()[-2000:]}")
        p = subprocess.run([DSCTL, "generate", "--socket", sock, "--max-tokens", "24",
                            NEW_PROMPT], capture_output=True, timeout=120)
        check(p.returncode == 0 and p.stdout == new_want, "the model stopped serving after "
              "failed reloads")

        # --- 4: a mutating call from a uid outside the allowed set.
        if os.geteuid() != 0:
            print("SKIP (part 4): AccessDenied needs root to run dsctl as uid 65534")
        elif not shutil.which("setpriv"):
            print("SKIP (part 4): setpriv is not installed")
        else:
            for verb in (["drain"], ["reload"], ["cancel", "1"]):
                r = dsctl(*verb, user=NOBODY)
                check(r.returncode == 1 and "denied" in r.stderr.lower(),
                      f"dsctl {verb[0]} as nobody: rc={r.returncode} {r.stderr!r}")
            r = dsctl("status", "--json", user=NOBODY)
            check(r.returncode == 0, f"status as nobody may read: {r.stderr!r}")
            check(status().get("State") == "ready", "a refused call changed the state")

        # --- back to stories260K for the drain test, by SIGHUP (= Reload("")), with an HTTP
        # stream on the old model across it: when that client goes away after the switch,
        # its request is cancelled on the old model, which is then freed at once rather
        # than after the 2000 tokens.
        hs = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        hs.connect(http_sock)
        body = json.dumps({"prompt": "x", "max_tokens": 2000, "temperature": 0,
                           "stream": True}).encode()
        hs.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: dsd\r\n"
                   b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                   + body)
        hs.settimeout(10)
        head = b""
        while b"data:" not in head:
            chunk = hs.recv(65536)
            if not chunk:
                break
            head += chunk
        check(b"data:" in head, f"the HTTP stream did not start: {head[:300]!r}")
        freed = d.text().count("previous model finished its last request")
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while status().get("Model") != model_a and time.monotonic() < deadline:
            time.sleep(0.1)
        check(wait_state("ready").get("Model") == model_a, "SIGHUP did not reload the config")
        hs.close()
        deadline = time.monotonic() + 2
        while (d.text().count("previous model finished its last request") == freed
               and time.monotonic() < deadline):
            time.sleep(0.05)
        check(d.text().count("previous model finished its last request") > freed,
              "an HTTP client that left after the reload kept the old model busy")

        # --- 2: Drain, then SIGTERM while 8 requests stream.
        code, _ = http_status(http_sock, "GET", "/health")
        check(code == 200, f"/health when ready answered {code}, not 200")
        streams = [start([TOOL, "stream", sock, LONG_PROMPT, "200", "20"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(8)]
        for s in streams:
            check(started(s), "a stream did not start")
        r = dsctl("drain")
        check(r.returncode == 0, f"dsctl drain: {r.stderr}")
        check(status().get("State") == "draining", "State is not draining")
        late = subprocess.run([TOOL, "stream", sock, LONG_PROMPT, "10", "0"],
                              capture_output=True, text=True, timeout=60)
        check(f"error {DS_ERR_DRAINING}" in late.stderr and "draining" in late.stderr,
              f"a request during drain did not get 'draining': {late.stderr!r}")
        # dsctl generate prints the daemon's message, which names the error once.
        p = subprocess.run([DSCTL, "generate", "--socket", sock, "Once"], capture_output=True,
                           text=True, timeout=60)
        check(p.returncode == 1 and p.stderr.count("draining") == 1,
              f"dsctl generate during drain: rc={p.returncode} {p.stderr!r}")
        # The HTTP listener refuses the same way: 503 with OpenAI's error shape.
        code, body = http_status(http_sock, "POST", "/v1/completions",
                                 {"prompt": "Once", "max_tokens": 4})
        check(code == 503 and "error" in json.loads(body),
              f"an HTTP completion during drain got {code} {body!r}, not 503")
        code, _ = http_status(http_sock, "GET", "/health")
        check(code == 503, f"/health during drain answered {code}, not 503")
        d.proc.send_signal(signal.SIGTERM)
        for i, s in enumerate(streams):
            out, err = s.communicate(timeout=120)
            check(s.returncode == 0 and b"final" in err,
                  f"stream {i} got no final event: rc={s.returncode} {err!r}")
        rc = d.wait(60)
        check(rc == 0 and not failures, f"dsd exited {rc} after SIGTERM\n{d.text()[-3000:]}")
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()

    notify_protocol(tmp, model_a, good)
    socket_activation(tmp, good)


def socket_activation(tmp, good):
    """dsd takes its socket from systemd (sd_listen_fds) and, with no model, refuses
    connections with the reason."""
    if not shutil.which("systemd-socket-activate"):
        print("SKIP (socket activation): systemd-socket-activate is not installed")
        return
    sa_sock = os.path.join(tmp, "sa.sock")
    cfg = os.path.join(tmp, "sa.json")
    fields = dict(good, bus="none", socket=dict(path=sa_sock, mode="0666"))
    del fields["model"]
    write_config(cfg, **fields)
    log = open(os.path.join(tmp, "sa.log"), "wb")
    p = start(["systemd-socket-activate", "-l", sa_sock, DSD, "--config", cfg],
              stderr=log, stdout=log)
    deadline = time.monotonic() + 30
    while not os.path.exists(sa_sock) and time.monotonic() < deadline:
        time.sleep(0.05)
    r = subprocess.run([TOOL, "connect", sa_sock], capture_output=True, text=True, timeout=60)
    check(r.stdout.startswith("-8205 ") and "no model" in r.stdout,
          f"no-model refusal through the inherited socket: {r.stdout!r} {r.stderr!r}")
    p.send_signal(signal.SIGTERM)
    rc = p.wait(60)
    log.close()
    text = open(os.path.join(tmp, "sa.log"), encoding="utf-8", errors="replace").read()
    check("(from systemd)" in text and rc == 0, f"socket activation: rc={rc}\n{text}")


def notify_protocol(tmp, model_a, good):
    """sd_notify against a fake NOTIFY_SOCKET (no systemd here)."""
    if os.path.isdir("/run/systemd/system"):
        print("note: systemd runs here; the unit-level watchdog test is not automated yet, "
              "the protocol test below runs anyway")
    else:
        print("SKIP (part 6, real systemd): no systemd as PID 1 in this environment; "
              "testing the notify protocol with a fake NOTIFY_SOCKET instead")
    path = os.path.join(tmp, "notify")
    ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    ns.bind(path)
    msgs = []  # (monotonic time, message)

    def reader():
        while True:
            try:
                data = ns.recv(4096)
            except OSError:
                return
            if not data:
                return
            msgs.append((time.monotonic(), data.decode()))

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    cfg = os.path.join(tmp, "notify.json")
    write_config(cfg, **dict(good, bus="none", socket=dict(path=os.path.join(tmp, "n.sock"))))
    env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="1000000",
               DSD_TEST_STALL_ENGINE_SEC="4")
    env.pop("WATCHDOG_PID", None)
    d = Dsd(tmp, cfg, env)
    try:
        deadline = time.monotonic() + 60
        while not any("READY=1" in m for _, m in msgs) and time.monotonic() < deadline:
            time.sleep(0.05)
        t_ready = next((ts for ts, m in msgs if "READY=1" in m), None)
        check(t_ready is not None, f"no READY=1\n{d.text()}")
        before = [m for ts, m in msgs if t_ready is not None and ts < t_ready]
        check(any("STATUS=loading" in m and "layers" in m for m in before),
              f"no 'loading N/M layers' STATUS before READY=1: {before}")
        time.sleep(1.0)
        d.proc.send_signal(signal.SIGHUP)
        time.sleep(1.5)
        seq = [m for _, m in msgs]
        i_rel = next((i for i, m in enumerate(seq) if "RELOADING=1" in m), None)
        check(i_rel is not None and "MONOTONIC_USEC=" in seq[i_rel],
              f"no RELOADING=1 with MONOTONIC_USEC after SIGHUP: {seq}")
        check(i_rel is not None and any("READY=1" in m for m in seq[i_rel + 1:]),
              f"no READY=1 after RELOADING=1: {seq}")
        pings = [ts for ts, m in msgs if "WATCHDOG=1" in m]
        check(len(pings) >= 3, f"too few WATCHDOG=1 pings before the stall: {len(pings)}")
        # The stall begins 4 s after the newest engine loop started; wait past it.
        time.sleep(5.5)
        now = time.monotonic()
        pings = [ts for ts, m in msgs if "WATCHDOG=1" in m]
        check(pings and now - pings[-1] > 1.5,
              f"WATCHDOG=1 pings did not stop while the engine stalls "
              f"(last {now - pings[-1] if pings else None:.1f} s ago)")
        check("stalling the engine thread" in d.text(), "the stall was not injected")
        d.proc.send_signal(signal.SIGTERM)
        rc = d.wait(60)
        time.sleep(0.2)
        check(any("STOPPING=1" in m for _, m in msgs), "no STOPPING=1")
        check(rc == 0, f"dsd exited {rc}\n{d.text()}")
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
        ns.close()


def run():
    try:
        sc.run(main)
    finally:
        kill_all()
        if failures:
            print(f"{len(failures)} failures")
            sys.exit(1)


if __name__ == "__main__":
    try:
        run()
    except SystemExit as e:
        if e.code in (0, None) and failures:
            sys.exit(1)
        raise
