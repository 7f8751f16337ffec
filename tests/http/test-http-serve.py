#!/usr/bin/env python3
"""The HTTP listener end to end on stories260K over a Unix socket, with http.client:
greedy answers (streamed and not) equal `dsd --generate`, usage, SSE framing, /metrics
moving after a known workload, error statuses and bodies, a client leaving mid-stream,
and a slowloris connection closed after the request timeout."""
import http.client
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

shared = os.environ["DSD_SHARED"]
dsquant = os.environ["DSQUANT"]
dsd = os.environ["DSD"]
src = os.path.join(shared, "models", "stories260K")
here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("expo", os.path.join(here, "check-exposition.py"))
expo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(expo)
TOKEN = "s3cret-token"
PROMPT = "Once upon a time"


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path, timeout=60):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def request(path, method, url, body=None, token=TOKEN, conn=None):
    c = conn or UnixHTTP(path)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + token
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    c.request(method, url, body=data, headers=headers)
    r = c.getresponse()
    return r.status, r.read(), dict(r.getheaders())


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)
    print("ok  ", what)


def check_error(status, body, want_status, param, what):
    j = json.loads(body)
    e = j.get("error", {})
    check(status == want_status and set(e) >= {"message", "type", "param", "code"}
          and e["param"] == param, f"{what}: {status} {body[:160]!r}")


def sse_events(raw):
    """Splits an SSE body strictly into data payloads."""
    text = raw.decode()
    check(text.endswith("\n\n"), "SSE body ends with a blank line")
    events = text[:-2].split("\n\n")
    for ev in events:
        check(ev.startswith("data: ") and "\n" not in ev, f"SSE event framing {ev[:40]!r}")
    return [ev[6:] for ev in events]


def metrics(path):
    status, body, hdr = request(path, "GET", "/metrics")
    check(status == 200 and hdr["Content-Type"].startswith("text/plain; version=0.0.4"),
          "/metrics content type")
    return expo.parse(body.decode())


def main():
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "stories260K")
        subprocess.run([dsquant, "convert", "--from", "llama2c",
                        os.path.join(src, "stories260K.bin"), os.path.join(src, "tok512.bin"),
                        model], check=True, capture_output=True)
        want = subprocess.run([dsd, "--model", model, "--generate", PROMPT, "--max-tokens",
                               "40"], capture_output=True, check=True).stdout.decode()
        tokfile = os.path.join(tmp, "token")
        with open(tokfile, "w") as f:
            f.write(TOKEN + "\n")
        hp = os.path.join(tmp, "http.sock")
        cfg = {"auth_token_file": tokfile, "request_timeout_ms": 1000,
               "idle_timeout_ms": 5000, "max_body_bytes": 65536}
        d = subprocess.Popen([dsd, "--model", model, "--socket", os.path.join(tmp, "dsd.sock"),
                              "--http-listen", hp, "--http-config", json.dumps(cfg),
                              "--queue", "1", "--max-batch", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            for _ in range(200):
                if os.path.exists(hp):
                    break
                time.sleep(0.05)
            run(hp, want)
        finally:
            d.terminate()
            out = d.communicate(timeout=30)[0].decode(errors="replace")
            if d.returncode != 0:
                print(out)
                check(False, f"dsd exited {d.returncode}")
    print("all passed")


def run(hp, want):
    status, body, _ = request(hp, "GET", "/health", token=None)
    check(status == 200, "/health without a token")
    status, body, _ = request(hp, "GET", "/v1/models", token=None)
    check_error(status, body, 401, None, "no token: 401")
    status, body, _ = request(hp, "GET", "/v1/models", token="wrong")
    check_error(status, body, 401, None, "wrong token: 401")
    status, body, _ = request(hp, "GET", "/v1/models")
    check(status == 200 and json.loads(body)["data"][0]["object"] == "model", "/v1/models")

    m0 = metrics(hp)
    gen0 = expo.value(m0, "dsd_generation_tokens_total")

    # Non-streaming completion: the greedy text of dsd --generate.
    req = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0}
    status, body, _ = request(hp, "POST", "/v1/completions", req)
    j = json.loads(body)
    check(status == 200 and j["object"] == "text_completion", "completion 200")
    check(j["choices"][0]["text"] == want, f"completion text equals dsd --generate: {want!r}")
    u = j["usage"]
    check(u["completion_tokens"] == 40 and u["total_tokens"] == u["prompt_tokens"] + 40
          and j["choices"][0]["finish_reason"] == "length", f"usage {u}")
    status, body, _ = request(hp, "POST", "/tokenize", {"prompt": PROMPT})
    check(json.loads(body)["count"] == u["prompt_tokens"], "/tokenize counts the prompt")

    # Streaming chat on the same connection (keep-alive): same text, valid SSE.
    conn = UnixHTTP(hp)
    req = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 40,
           "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    status, body, hdr = request(hp, "POST", "/v1/chat/completions", req, conn=conn)
    check(status == 200 and hdr["Content-Type"] == "text/event-stream", "stream head")
    events = sse_events(body)
    check(events[-1] == "[DONE]", "stream ends with [DONE]")
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    check(text == want, "streamed text equals dsd --generate")
    check(chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 40,
          "usage chunk last")
    check(chunks[-2]["choices"][0]["finish_reason"] == "length", "finish chunk")
    status, body, _ = request(hp, "POST", "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": PROMPT}],
                               "max_tokens": 40, "temperature": 0}, conn=conn)
    j = json.loads(body)
    check(j["choices"][0]["message"]["content"] == want, "non-streamed chat, same connection")
    conn.close()

    m1 = metrics(hp)
    check(expo.value(m1, "dsd_generation_tokens_total") - gen0 == 120,
          "generation counter moved by 3 x 40")
    check(expo.value(m1, "dsd_requests_finished_total", reason="length")
          - expo.value(m0, "dsd_requests_finished_total", reason="length") == 3,
          "finished{length} moved by 3")
    check(expo.value(m1, "dsd_time_to_first_token_seconds_count") >= 3, "TTFT observed")

    # Errors: bad field, bad JSON, over-long body, over-long prompt, unknown endpoint.
    status, body, _ = request(hp, "POST", "/v1/completions", {"prompt": PROMPT, "n": 2})
    check_error(status, body, 400, "n", "n=2 names n")
    status, body, _ = request(hp, "POST", "/v1/completions", {"prompt": PROMPT,
                                                              "temperature": "hot"})
    check_error(status, body, 400, "temperature", "wrong type names the field")
    status, body, _ = request(hp, "POST", "/v1/completions", b"{not json")
    check_error(status, body, 400, None, "malformed JSON")
    # The 413 comes from the head alone, before any body byte is sent.
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(hp)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 70000\r\n\r\n")
    r = http.client.HTTPResponse(s)
    r.begin()
    check_error(r.status, r.read(), 413, None, "body over max_body_bytes: 413")
    s.close()
    status, body, _ = request(hp, "POST", "/v1/completions",
                              {"prompt": "Once upon a time " * 200, "max_tokens": 1})
    check_error(status, body, 400, "prompt", "over-long prompt: 400 naming prompt")
    check(json.loads(body)["error"]["code"] == "context_length_exceeded", "context code")
    status, body, _ = request(hp, "GET", "/v2/nothing")
    check_error(status, body, 404, None, "unknown endpoint: 404")

    # A client leaving mid-stream: its request is cancelled, running goes back to 0.
    s = socket.socket(socket.AF_UNIX)
    s.connect(hp)
    b = json.dumps({"prompt": PROMPT, "max_tokens": 200, "temperature": 0.8,
                    "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
              TOKEN.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
    s.recv(100)
    s.close()
    for _ in range(100):
        m = metrics(hp)
        if expo.value(m, "dsd_requests_running") == 0 and \
                expo.value(m, "dsd_requests_finished_total", reason="cancelled") >= 1:
            break
        time.sleep(0.05)
    check(expo.value(m, "dsd_requests_running") == 0, "disconnect frees the request")

    # Slowloris: a head that never ends gets 408 and a close after request_timeout_ms.
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(hp)
    t0 = time.monotonic()
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    got = b""
    while True:
        try:
            k = s.recv(4096)
        except OSError:
            break
        if not k:
            break
        got += k
    dt = time.monotonic() - t0
    check(got.startswith(b"HTTP/1.1 408") and 0.9 <= dt < 5, f"slowloris closed after {dt:.2f}s")
    s.close()

    # A streaming client beside hostile ones is unaffected: raw garbage gets 400 + close.
    s = socket.socket(socket.AF_UNIX)
    s.connect(hp)
    s.sendall(os.urandom(64).replace(b"\n", b"x") + b"\r\n\r\n")
    s.settimeout(5)
    check(s.recv(100)[:10] in (b"HTTP/1.1 4", b"HTTP/1.1 5"), "random bytes get an error")
    s.close()
    status, body, _ = request(hp, "POST", "/v1/completions", {"prompt": PROMPT,
                                                              "max_tokens": 40,
                                                              "temperature": 0})
    check(json.loads(body)["choices"][0]["text"] == want, "still serving after hostile input")


if __name__ == "__main__":
    main()
