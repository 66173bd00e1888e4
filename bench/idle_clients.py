#!/usr/bin/env python3
"""Opens many idle PostgreSQL client connections and holds them.

Used by bench/run.py to measure what an idle client costs a pooler. Each
connection sends a StartupMessage, completes a `trust` login (AuthenticationOk
... ReadyForQuery) and then sends nothing more. Standard library only.

One process drives thousands of non-blocking sockets with selectors; run.py
starts several of these processes so that the client side (Python) is not the
bottleneck and no process needs more file descriptors than its limit.

Protocol with the parent, on stdout/stdin (one line each):
  worker -> "READY {json}"  once every connection has logged in or failed:
                            {"ok": n, "errors": {reason: count}, "elapsed": s}
  parent -> "check"          worker answers "CHECK {json}" {"alive": n}: how
                            many logged-in connections the pooler still keeps
  parent closes stdin        worker closes every socket and exits
The worker also exits on its own after --max-lifetime seconds, so that a
crashed parent cannot leave thousands of connections behind.
"""

import argparse
import errno
import json
import resource
import selectors
import socket
import struct
import sys
import time
from collections import Counter

# Linux: let connect() choose the source port per 4-tuple even after bind()
# to a source address, instead of reserving a port for that address at bind
# time. Without it, a bound source address runs out of ports much sooner.
IP_BIND_ADDRESS_NO_PORT = 24


def startup_message(user, database):
    params = b"user\0" + user.encode() + b"\0database\0" + database.encode() + b"\0\0"
    return struct.pack("!ii", 8 + len(params), 196608) + params


def error_text(body):
    """The SQLSTATE and message fields of an ErrorResponse body."""
    fields = {}
    for part in body.split(b"\0"):
        if part:
            fields[part[:1]] = part[1:].decode("utf-8", "replace")
    return "server error %s: %s" % (fields.get(b"C", "?"), fields.get(b"M", "?"))


class Conn:
    __slots__ = ("sock", "started", "buf", "connected")

    def __init__(self, sock):
        self.sock = sock
        self.started = time.monotonic()
        self.buf = b""
        self.connected = False


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--source", help="local address to bind (spreads ephemeral ports over addresses)")
    ap.add_argument("--user", default="postgres")
    ap.add_argument("--database", default="bench")
    ap.add_argument("--in-flight", type=int, default=100,
                    help="logins in progress at once; more only overflows the listen backlog")
    ap.add_argument("--login-timeout", type=float, default=20.0)
    ap.add_argument("--deadline", type=float, default=120.0,
                    help="seconds after which no new connection is started")
    ap.add_argument("--stall", type=float, default=10.0,
                    help="stop starting connections when none has logged in for this long "
                         "(a pooler out of descriptors stops answering rather than refusing)")
    ap.add_argument("--max-lifetime", type=float, default=900.0)
    args = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    startup = startup_message(args.user, args.database)
    sel = selectors.DefaultSelector()
    pending = {}  # fd -> Conn, login in progress
    idle = []     # logged-in sockets, held until the parent says so
    errors = Counter()
    started = 0
    t0 = time.monotonic()
    last_login = t0
    stop_starting = False

    def fail(conn, reason):
        errors[reason] += 1
        sel.unregister(conn.sock)
        del pending[conn.sock.fileno()]
        conn.sock.close()

    while True:
        now = time.monotonic()
        if now - t0 > args.deadline or now - last_login > args.stall:
            stop_starting = True
        while not stop_starting and started < args.count and len(pending) < args.in_flight:
            try:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            except OSError as e:
                # Out of descriptors on the client side: nothing more can be
                # opened, count the rest under this reason.
                errors["client: " + (errno.errorcode.get(e.errno, str(e)))] += args.count - started
                started = args.count
                stop_starting = True
                break
            started += 1
            s.setblocking(False)
            try:
                if args.source:
                    s.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
                    s.bind((args.source, 0))
                rc = s.connect_ex((args.host, args.port))
            except OSError as e:
                rc = e.errno
            if rc not in (0, errno.EINPROGRESS):
                errors["connect: " + errno.errorcode.get(rc, str(rc))] += 1
                s.close()
                continue
            c = Conn(s)
            pending[s.fileno()] = c
            sel.register(s, selectors.EVENT_WRITE, c)

        if not pending and (stop_starting or started >= args.count):
            break

        for key, _ in sel.select(timeout=0.2):
            c = key.data
            if not c.connected:
                err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    fail(c, "connect: " + errno.errorcode.get(err, str(err)))
                    continue
                c.connected = True
                try:
                    c.sock.send(startup)  # 40-odd bytes: always sent whole on a fresh socket
                except OSError as e:
                    fail(c, "send: " + errno.errorcode.get(e.errno, str(e)))
                    continue
                sel.modify(c.sock, selectors.EVENT_READ, c)
                continue
            try:
                data = c.sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError as e:
                fail(c, "recv: " + errno.errorcode.get(e.errno, str(e)))
                continue
            if not data:
                fail(c, "closed by pooler before ReadyForQuery")
                continue
            c.buf += data
            # Walk the complete messages: AuthenticationOk, ParameterStatus...,
            # BackendKeyData, ReadyForQuery.
            while len(c.buf) >= 5:
                kind = c.buf[:1]
                (length,) = struct.unpack("!i", c.buf[1:5])
                if len(c.buf) < 1 + length:
                    break
                body = c.buf[5:1 + length]
                c.buf = c.buf[1 + length:]
                if kind == b"E":
                    fail(c, error_text(body))
                    break
                if kind == b"R" and struct.unpack("!i", body[:4])[0] != 0:
                    fail(c, "pooler asked for a password (auth code %d)" % struct.unpack("!i", body[:4])[0])
                    break
                if kind == b"Z":
                    sel.unregister(c.sock)
                    del pending[c.sock.fileno()]
                    idle.append(c.sock)
                    last_login = time.monotonic()
                    break

        now = time.monotonic()
        for c in [c for c in pending.values() if now - c.started > args.login_timeout]:
            fail(c, "login timed out (%gs)" % args.login_timeout)

    if started < args.count:
        errors["not attempted (stalled or past the deadline)"] += args.count - started
    report = {"ok": len(idle), "errors": dict(errors), "elapsed": round(time.monotonic() - t0, 3)}
    print("READY " + json.dumps(report), flush=True)

    # Hold the connections until the parent is done measuring.
    sel.close()
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin, selectors.EVENT_READ)
    end = time.monotonic() + args.max_lifetime
    while time.monotonic() < end:
        if not sel.select(timeout=1.0):
            continue
        line = sys.stdin.readline()
        if not line:
            break
        if line.strip() == "check":
            alive = 0
            for s in idle:
                try:
                    alive += s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
                except BlockingIOError:
                    alive += 1  # nothing to read and not closed: still connected
                except OSError:
                    pass
            print("CHECK " + json.dumps({"alive": alive}), flush=True)
    for s in idle:
        s.close()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
