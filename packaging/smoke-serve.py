#!/usr/bin/env python3
"""Serve-and-infer smoke test of a vigil binary, playing systemd (used by scripts/ci-packaging.sh).

usage: smoke-serve.py CONFIG IMAGE [--] COMMAND...   (COMMAND runs the binary, e.g. under qemu)

Binds a NOTIFY_SOCKET, starts `COMMAND serve --config CONFIG` with WATCHDOG_USEC, waits for
READY=1, checks /v1/models, classifies IMAGE (expects 'espresso' top-1 when IMAGE is the
shared coffee photo), waits for a WATCHDOG=1 ping, sends SIGTERM and expects STOPPING=1 and a
clean exit. Prints one line per step; exits non-zero on any failure.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def main():
    args = sys.argv[1:]
    if len(args) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    config, image = args[0], args[1]
    cmd = args[2:]
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    tmp = tempfile.mkdtemp(prefix="vigil-smoke-")
    sock_path = os.path.join(tmp, "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    env = dict(os.environ, NOTIFY_SOCKET=sock_path, WATCHDOG_USEC="20000000", RUST_LOG="info")
    env.pop("JOURNAL_STREAM", None)
    log_path = os.path.join(tmp, "stderr.log")
    log = open(log_path, "wb")
    started = time.time()
    proc = subprocess.Popen(cmd + ["serve", "--config", config], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)

    def fail(msg):
        proc.kill()
        proc.wait()
        sys.stderr.write(open(log_path, "rb").read().decode(errors="replace")[-4000:])
        print(f"smoke: FAIL: {msg}")
        sys.exit(1)

    def wait_for(line, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if proc.poll() is not None:
                fail(f"exited with {proc.returncode} before {line}")
            sock.settimeout(1.0)
            try:
                msg = sock.recv(4096).decode()
            except socket.timeout:
                continue
            if line in msg.splitlines():
                return msg
        fail(f"no {line} within {timeout}s")

    ready = wait_for("READY=1", 900)
    status = next(l[7:] for l in ready.splitlines() if l.startswith("STATUS="))
    print(f"smoke: READY=1 after {time.time() - started:.1f}s: {status}")
    addr = status.split(" on ")[1].split(";")[0]
    with urllib.request.urlopen(f"http://{addr}/v1/models", timeout=60) as r:
        names = [m["name"] for m in json.load(r)["models"]]
    print(f"smoke: /v1/models -> {names}")
    if "efficientnet-lite0" not in names:
        fail("efficientnet-lite0 not served")
    data = open(image, "rb").read()
    req = urllib.request.Request(f"http://{addr}/v1/models/efficientnet-lite0/infer?top_k=3",
                                 data=data, headers={"Content-Type": "image/png"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.load(r)
    classes = out["results"]["classes"]
    print(f"smoke: infer {os.path.basename(image)} in {time.time() - t0:.1f}s -> "
          + ", ".join(f"{c['label']} {c['score']:.3f}" for c in classes))
    if os.path.basename(image) == "coffee.png" and classes[0]["label"] != "espresso":
        fail("coffee.png is not classified as espresso")
    wait_for("WATCHDOG=1", 120)
    print("smoke: WATCHDOG=1 received")
    proc.send_signal(signal.SIGTERM)
    stopping = wait_for("STOPPING=1", 120)
    print(f"smoke: STOPPING=1: {stopping.strip().splitlines()[-1]}")
    try:
        rc = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        fail("did not exit after SIGTERM")
    if rc != 0:
        fail(f"exit status {rc} after SIGTERM")
    print("smoke: clean exit after SIGTERM")
    return 0


if __name__ == "__main__":
    sys.exit(main())
