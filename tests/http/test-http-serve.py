#!/usr/bin/env python3
"""The HTTP listener end to end on stories260K over a Unix socket, with http.client:
greedy answers (streamed and not) equal `dsd --generate`, usage, SSE framing, /metrics
(through prometheus_client's parser and our strict one) moving exactly as a known workload
says, error statuses and bodies, a full queue, a client leaving mid-stream, and hostile
connections (oversized heads and bodies, bad JSON and types, slowloris, random bytes)
while streaming clients beside them keep getting the greedy text."""
import http.client
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:
    # Test-only dependency from PyPI (tools/install-deps.sh installs it): a missing parser
    # must fail the test, never skip it.
    print(f"FAIL: prometheus_client is not installed ({e}); run tools/install-deps.sh or "
          "python3 -m pip install prometheus_client")
    sys.exit(1)

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
KV_BYTES_PER_TOKEN = 1280  # stories260K: room for 4 full contexts, so a batch of 2 fits


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


def prom_samples(text):
    """Every sample through prometheus_client's parser: {(name, labels): value}."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            key = (smp.name, frozenset(smp.labels.items()))
            if key in out:
                raise ValueError(f"prometheus_client: duplicate sample {key}")
            out[key] = smp.value
    return out


def metrics(path):
    status, body, hdr = request(path, "GET", "/metrics")
    check(status == 200 and hdr["Content-Type"].startswith("text/plain; version=0.0.4"),
          "/metrics content type")
    text = body.decode()
    strict = expo.parse(text)
    try:
        prom = prom_samples(text)
    except ValueError as e:
        check(False, f"prometheus_client parses /metrics: {e}")
    ours = {(n, frozenset(lab.items())): v
            for fam in strict.values() for n, lab, v in fam["samples"]}
    check(prom == ours and len(prom) > 0,
          f"prometheus_client and the strict parser read the same {len(prom)} samples")
    check(all(dict(k[1]).get("model") for k in prom), "every series has the model label")
    return strict


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
        cfg = {"listen": hp, "auth_token_file": tokfile, "request_timeout_ms": 1000,
               "idle_timeout_ms": 5000, "max_body_bytes": 65536}
        d = subprocess.Popen([dsd, "--model", model, "--socket", os.path.join(tmp, "dsd.sock"),
                              "--http-listen", hp, "--http-config", json.dumps(cfg),
                              "--queue", "2", "--max-batch", "2",
                              "--kv-bytes", str(KV_BYTES_PER_TOKEN * 512 * 4)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            # The listener opens before the model is resident and answers 503 until then.
            ready = False
            for _ in range(400):
                if os.path.exists(hp):
                    status, body, _ = request(hp, "GET", "/health", token=None)
                    if status == 200:
                        ready = True
                        break
                    check(status == 503 and json.loads(body)["status"] == "loading",
                          f"/health while loading: {status} {body!r}")
                time.sleep(0.05)
            check(ready, "/health never answered 200")
            run(hp, want)
            bench(hp, tmp)
        finally:
            d.terminate()
            out = d.communicate(timeout=30)[0].decode(errors="replace")
            if d.returncode != 0:
                print(out)
                check(False, f"dsd exited {d.returncode}")
    no_model()
    print("all passed")


def no_model():
    """Without a model the listener is up: /health and generation answer 503, /metrics 200."""
    with tempfile.TemporaryDirectory() as tmp:
        hp = os.path.join(tmp, "http.sock")
        d = subprocess.Popen([dsd, "--socket", os.path.join(tmp, "dsd.sock"), "--http-listen", hp],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            for _ in range(200):
                if os.path.exists(hp):
                    break
                time.sleep(0.05)
            status, body, _ = request(hp, "GET", "/health", token=None)
            check(status == 503 and json.loads(body)["status"] == "loading",
                  f"/health without a model: {status} {body!r}")
            status, body, _ = request(hp, "POST", "/v1/completions", {"prompt": "a"}, token=None)
            check_error(status, body, 503, None, "a completion without a model: 503")
            status, body, _ = request(hp, "GET", "/metrics", token=None)
            check(status == 200 and b"dsd_requests_running" in body,
                  f"/metrics without a model: {status}")
        finally:
            d.terminate()
            d.communicate(timeout=30)


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
    usages = []  # what the answers of the known workload reported

    # Non-streaming completion: the greedy text of dsd --generate.
    req = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0}
    status, body, _ = request(hp, "POST", "/v1/completions", req)
    j = json.loads(body)
    check(status == 200 and j["object"] == "text_completion", "completion 200")
    check(j["choices"][0]["text"] == want, f"completion text equals dsd --generate: {want!r}")
    u = j["usage"]
    usages.append(u)
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
    usages.append(chunks[-1]["usage"])
    check(chunks[-2]["choices"][0]["finish_reason"] == "length", "finish chunk")
    status, body, _ = request(hp, "POST", "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": PROMPT}],
                               "max_tokens": 40, "temperature": 0}, conn=conn)
    j = json.loads(body)
    check(j["choices"][0]["message"]["content"] == want, "non-streamed chat, same connection")
    usages.append(j["usage"])
    conn.close()

    m1 = metrics(hp)

    def moved(name, **labels):
        return expo.value(m1, name, **labels) - expo.value(m0, name, **labels)

    prompt = sum(u["prompt_tokens"] for u in usages)
    generated = sum(u["completion_tokens"] for u in usages)
    check(generated == 120 and moved("dsd_generation_tokens_total") == generated,
          f"generation counter moved by the answers' completion_tokens ({generated})")
    check(moved("dsd_prompt_tokens_total") == prompt,
          f"prompt counter moved by the answers' prompt_tokens ({prompt})")
    check(moved("dsd_requests_finished_total", reason="length") == 3, "finished{length} +3")
    check(all(moved("dsd_requests_finished_total", reason=r) == 0
              for r in ("eos", "stop", "cancelled", "error")), "no other finish reason moved")
    for h in ("dsd_time_to_first_token_seconds", "dsd_e2e_request_latency_seconds",
              "dsd_request_queue_time_seconds"):
        check(moved(h + "_count") == 3 and moved(h + "_bucket", le="+Inf") == 3,
              f"{h}: 3 observations")
    check(moved("dsd_inter_token_latency_seconds_count") == generated - 3,
          "inter-token latency: one per token after each first")
    check(expo.value(m1, "dsd_requests_running") == 0 and
          expo.value(m1, "dsd_requests_waiting") == 0, "nothing running or waiting")

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

    full_queue(hp)
    hostile_beside_streams(hp, want)
    status, body, _ = request(hp, "POST", "/v1/completions", {"prompt": PROMPT,
                                                              "max_tokens": 40,
                                                              "temperature": 0})
    check(json.loads(body)["choices"][0]["text"] == want, "still serving after hostile input")


def bench(hp, tmp):
    """dsbench --http: its client reads the streams and the publish times dsd_timing adds."""
    out = os.path.join(tmp, "bench.json")
    subprocess.run([sys.argv[1], "--http", hp, "--api-key", TOKEN, "--clients", "2",
                    "--concurrency", "1", "--requests", "3", "--max-tokens", "16",
                    "--rtt-rounds", "100", "--json", out], check=True, timeout=120,
                   stdout=subprocess.DEVNULL)
    with open(out) as f:
        j = json.load(f)
    lat = j["latency"]
    check(j["transport"] == "http" and j["requests"] == 6 and j["errors"] == 0
          and 0 < j["generated_tokens"] <= 6 * 16, f"dsbench --http: {j['requests']} requests")
    check(lat["delivery"]["n"] >= 6 and 0 < lat["delivery"]["p50_us"] < 1e6
          and lat["ttft"]["n"] == 6, f"dsbench --http delivery latency {lat['delivery']}")


def raw_request(path, body, url="/v1/completions"):
    """A request written by hand on a fresh socket, for answers read later or never; the
    daemon closes the connection after the answer."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(path)
    b = json.dumps(body).encode()
    s.sendall(b"POST " + url.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
              b"Authorization: Bearer " +
              TOKEN.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
    return s


def read_all(s):
    got = b""
    while True:
        try:
            k = s.recv(65536)
        except OSError:
            break
        if not k:
            break
        got += k
    return got


def full_queue(hp):
    """dsd runs with --max-batch 2 --queue 2: two requests running and two waiting fill
    it, the next gets 429 with OpenAI's error body; the earlier ones still finish. The
    queue counts requests the engine has not picked up yet, so each long one is sent
    once the one before streams."""
    long = []
    for _ in range(2):
        long.append(raw_request(hp, {"prompt": PROMPT, "max_tokens": 400, "temperature": 0,
                                     "stream": True}))
        check(long[-1].recv(1) == b"H", "a long request streams")
    waiting = [raw_request(hp, {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
               for _ in range(2)]
    for _ in range(400):
        if expo.value(metrics(hp), "dsd_requests_waiting") == 2:
            break
        time.sleep(0.002)
    status, body, hdr = request(hp, "POST", "/v1/chat/completions",
                                {"messages": [{"role": "user", "content": PROMPT}],
                                 "max_tokens": 8})
    check_error(status, body, 429, None, "full queue: 429")
    e = json.loads(body)["error"]
    check(e["code"] == "queue_full" and e["type"] and hdr.get("Retry-After") == "1",
          f"429 body and Retry-After: {e}")
    # The running ones first: a connection whose reader stalls past idle_timeout_ms is
    # closed.
    for a in long:
        check(read_all(a).endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), "running one completes")
        a.close()
    for b in waiting:
        rb = read_all(b)
        check(rb.startswith(b"HTTP/1.1 200") and b'"finish_reason":"length"' in rb,
              "a waiting request is answered")
        b.close()


def stream_text(hp, body):
    """One streamed completion on its own connection: (status, text, finish_reason)."""
    status, raw, hdr = request(hp, "POST", "/v1/chat/completions", body)
    if status != 200:
        return status, raw, None
    events = sse_events(raw)
    if events[-1] != "[DONE]":
        return status, "no [DONE]", None
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    return status, text, chunks[-1]["choices"][0]["finish_reason"]


def hostile_beside_streams(hp, want):
    """Hostile connections one after another while two clients stream greedy answers
    beside them the whole time (one of them reading slowly): every hostile one gets a
    clean error or close, every stream the greedy text."""
    # Two streams at most: the batch holds both and the queue never fills.
    stop = threading.Event()
    results = []
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 40,
            "temperature": 0, "stream": True}

    def streamer(slow):
        try:
            stream_loop(slow)
        except Exception as e:  # a thread's exception would not fail the test by itself
            results.append((slow, False, f"raised {e!r}", False))

    def stream_loop(slow):
        while not stop.is_set():
            if slow:
                # Reads the answer a few bytes at a time over about a second.
                s = raw_request(hp, body, "/v1/chat/completions")
                got = b""
                while True:
                    k = s.recv(512)
                    if not k:
                        break
                    got += k
                    time.sleep(0.01)
                s.close()
                # Each SSE event is one chunk of the chunked body: "data: {...}\n\n".
                chunks = [json.loads(line[6:]) for line in got.split(b"\r\n")
                          if line.startswith(b"data: {")]
                text = "".join(c["choices"][0]["delta"].get("content", "")
                               for c in chunks if c["choices"])
                results.append((slow, got.startswith(b"HTTP/1.1 200"), text,
                                b"[DONE]" in got))
            else:
                st, text, fin = stream_text(hp, body)
                results.append((slow, st == 200, text, fin == "length"))

    threads = [threading.Thread(target=streamer, args=(slow,)) for slow in (False, True)]
    for t in threads:
        t.start()
    try:
        hostile(hp)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    bad = [r for r in results if not (r[1] and r[2] == want and r[3])]
    n_slow = sum(1 for r in results if r[0])
    check(len(results) - n_slow >= 2 and n_slow >= 1 and not bad,
          f"{len(results)} streams ({n_slow} read slowly) beside the hostile clients all got "
          f"the greedy text {bad[:1]}")


def expect_close(s, what, statuses, within):
    """Reads until the daemon closes s: an error status among statuses, or a bare close."""
    t0 = time.monotonic()
    s.settimeout(within + 5)
    got = read_all(s)
    dt = time.monotonic() - t0
    s.close()
    ok = (got == b"" or any(got.startswith(b"HTTP/1.1 %d " % st) for st in statuses))
    check(ok and dt < within, f"{what}: {got[:40]!r} then closed after {dt:.2f}s")


def hostile(hp):
    def connect():
        s = socket.socket(socket.AF_UNIX)
        s.connect(hp)
        return s

    # Oversized head: one header line past max_header_bytes (16 KiB).
    s = connect()
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
    expect_close(s, "oversized header: 431", (431,), 5)
    s = connect()
    s.sendall(b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n")
    expect_close(s, "oversized target: 414", (414,), 5)
    s = connect()
    s.sendall(b"GET /health HTTP/1.1\r\n" + b"X-A: b\r\n" * 200 + b"\r\n")
    expect_close(s, "too many header fields: 431", (431,), 5)
    # Oversized body, announced and sent: refused from the head, then closed.
    s = connect()
    body = b'{"prompt": "' + b"x" * 100000 + b'"}'
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
              TOKEN.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body))
    try:
        s.sendall(body)
    except OSError:
        pass  # the daemon may close before it all went out
    expect_close(s, "oversized body: 413", (413,), 5)
    s = connect()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
              b"Transfer-Encoding: chunked\r\n\r\nffffffff\r\n")
    expect_close(s, "chunked body: 411", (411,), 5)
    s = connect()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
    expect_close(s, "negative Content-Length: 400", (400,), 5)

    # Malformed JSON and wrong types: 400 naming the field, the connection stays usable.
    conn = UnixHTTP(hp)
    for raw, param in ((b"{not json", None), (b"[1,2]", None), (b"\xff\xfe{}", None),
                       (b'{"prompt": "a"', None), (b'{"prompt": "a"}}', None)):
        status, body, _ = request(hp, "POST", "/v1/completions", raw, conn=conn)
        check_error(status, body, 400, param, f"malformed body {raw[:20]!r}: 400")
    for field, bad in (("max_tokens", "ten"), ("temperature", [1]), ("stream", "yes"),
                       ("stop", 7), ("top_k", 1.5), ("seed", {}), ("messages", "hi"),
                       ("logprobs", "x")):
        req = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}
        req[field] = bad
        status, body, _ = request(hp, "POST", "/v1/chat/completions", req, conn=conn)
        check_error(status, body, 400, field, f"wrong type of {field}: 400 naming it")
    conn.close()

    # Slowloris: a head trickling in, and a body that stops short; both 408 and closed
    # after request_timeout_ms (1 s) however slowly bytes keep coming.
    s = connect()
    t0 = time.monotonic()
    try:
        for ch in b"GET /health HTTP/1.1\r\nX-Slow: " + b"a" * 40:
            s.send(bytes([ch]))
            time.sleep(0.05)
            if time.monotonic() - t0 > 3:
                break
    except OSError:
        pass
    expect_close(s, "trickling head: 408", (408,), 5)
    s = connect()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
              b"\r\n{\"prompt\"")
    expect_close(s, "body that stops short: 408", (408,), 5)

    # Random bytes: an error status, or a close by the request timeout.
    for i in range(8):
        s = connect()
        blob = os.urandom(64 + 256 * i)
        try:
            s.sendall(blob if i % 2 else blob + b"\r\n\r\n")
        except OSError:
            pass
        expect_close(s, f"random bytes #{i}", (400, 405, 408, 411, 413, 414, 431, 501, 505), 5)


if __name__ == "__main__":
    main()
