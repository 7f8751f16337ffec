"""Shared by the serve tests: the stories260K model, a daemon in a temp dir, the tools."""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

BUILD = os.environ["DSD_BUILD"]
SHARED = os.environ["DSD_SHARED"]
DSD = os.environ["DSD"]
DSQUANT = os.environ["DSQUANT"]
DSCTL = os.path.join(BUILD, "tools", "dsctl", "dsctl")
TOOL = os.path.join(BUILD, "tests", "serve", "serve-tool")
SRC = os.path.join(SHARED, "models", "stories260K")


def skip(reason):
    print(f"SKIP: {reason}")
    sys.exit(77)


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def convert(tmp):
    model = os.path.join(tmp, "stories260K")
    subprocess.run([DSQUANT, "convert", "--from", "llama2c",
                    os.path.join(SRC, "stories260K.bin"), os.path.join(SRC, "tok512.bin"),
                    model], check=True, capture_output=True)
    return model


def greedy_prompts():
    return [c["prompt"] for c in json.load(open(os.path.join(SRC, "greedy.json"),
                                                encoding="utf-8"))]


class Daemon:
    """dsd serving model on a socket in tmp; stderr goes to a log file."""

    def __init__(self, tmp, model, *args):
        self.sock = os.path.join(tmp, "dsd.sock")
        self.log_path = os.path.join(tmp, "dsd.log")
        self.log = open(self.log_path, "wb")
        if os.path.exists(self.sock):
            os.unlink(self.sock)  # left by a daemon killed earlier in the same test
        self.proc = subprocess.Popen([DSD, "--model", model, "--backend", "cpu",
                                      "--socket", self.sock, "--kv-bytes", str(64 << 20),
                                      *args], stderr=self.log, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not self.listening():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                fail("the daemon did not start:\n" + self.text())
            time.sleep(0.02)

    def listening(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.sock)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def text(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def fds(self):
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        """SIGTERM; returns the exit status (killed after 20 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def info(self):
        p = subprocess.run([TOOL, "info", self.sock], capture_output=True, text=True,
                           timeout=30)
        if p.returncode != 0:
            fail("serve-tool info failed: " + p.stderr)
        return json.loads(p.stdout)

    def generate(self, prompt, max_tokens, *extra):
        p = subprocess.run([DSCTL, "generate", "--socket", self.sock, "--max-tokens",
                            str(max_tokens), *extra, prompt], capture_output=True, timeout=120)
        if p.returncode != 0:
            fail(f"dsctl generate {prompt!r} failed: {p.stderr!r}")
        return p.stdout


def wait_idle(d, timeout=10):
    """Until the daemon reports no active or queued request and all KV blocks free."""
    deadline = time.monotonic() + timeout
    while True:
        info = d.info()
        if info["active"] == 0 and info["queued"] == 0 and info["kv_free"] == info["kv_total"]:
            return info
        if time.monotonic() > deadline:
            return info
        time.sleep(0.05)


def run(main):
    """Runs main(tmp, model) in a temp dir; always stops the daemons it registers."""
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        model = convert(tmp)
        sys.exit(main(tmp, model) or 0)
