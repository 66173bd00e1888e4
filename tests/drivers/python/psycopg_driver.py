#!/usr/bin/env python3
"""psycopg 3 through a transaction pooler: server-side prepared statements both
forced (prepare=True) and by the default prepare_threshold (5), plain and in
pipeline mode. Prints one JSON line; exits 1 on a wrong result or an unexpected
error. The scenario is described in tests/it/drivers.rs."""

import threading

import psycopg
from psycopg import errors, generators, pq

from _common import (
    CACHED_PLAN, DDL, DDL_ATTEMPTS, DDL_CONNS, ITERS, Q_A, Q_BANG, Q_COUNT, Q_DIV,
    Q_DOUBLE, Q_INSERT, Q_STAR, Q_VAL, WORKERS, Fail, check, check_deadline, key,
    params, report,
)


def connect():
    return psycopg.connect(**params(), autocommit=True, connect_timeout=10)


def one(conn, q, args, prepare=None):
    return conn.execute(q, args, prepare=prepare).fetchone()


def txn(conn, w, i, pipelined):
    v = f"v{w}-{i}"
    with conn.transaction():
        if pipelined:
            with conn.pipeline():
                conn.execute(Q_INSERT, (w, i, v))
                c_val = conn.execute(Q_VAL, (w, i))
                c_count = conn.execute(Q_COUNT, (w,))
                c_bang = conn.execute(Q_BANG, (w, i))
            check("pipelined val", c_val.fetchone(), (v,))
            check("pipelined count", c_count.fetchone(), (i + 1,))
            check("pipelined update", c_bang.rowcount, 1)
        else:
            conn.execute(Q_INSERT, (w, i, v))
            check("val", one(conn, Q_VAL, (w, i)), (v,))
            check("count", one(conn, Q_COUNT, (w,)), (i + 1,))
            check("update", conn.execute(Q_BANG, (w, i)).rowcount, 1)


def division_by_zero(conn, w, i):
    try:
        one(conn, Q_DIV, (0,), prepare=True)
    except errors.DivisionByZero:
        pass
    else:
        raise Fail("100 / 0 did not fail")
    check("after error", one(conn, Q_DIV, (4,), prepare=True), (25,))
    if i % 14 != 3:
        return
    failed = False
    try:
        with conn.transaction():
            k = key(w, i)
            check("in txn", one(conn, Q_DOUBLE, (k, "t"), prepare=True), (2 * k, "t"))
            one(conn, Q_DIV, (0,), prepare=True)
    except errors.DivisionByZero:
        failed = True
    if not failed:
        raise Fail("100 / 0 in a transaction did not fail")
    check("count after rollback", one(conn, Q_COUNT, (w,)), (i + 1,))


def raw(conn, send):
    """One libpq-level request, waited for the way psycopg waits (the blocking
    libpq calls keep the GIL, which would stall every other worker while this
    one queues for a server)."""
    with conn.lock:
        send(conn.pgconn)
        return conn.wait(generators.execute(conn.pgconn))[-1]


def reset(conn, i):
    """DEALLOCATE ALL or DISCARD ALL from the client: psycopg forgets its own
    statements; a statement prepared at libpq level must be gone too."""
    command = "DEALLOCATE ALL" if (i // 10) % 2 == 0 else "DISCARD ALL"
    r = raw(conn, lambda pg: pg.send_prepare(b"chk", b"SELECT 1"))
    check("prepare chk", r.status, pq.ExecStatus.COMMAND_OK)
    conn.execute(command)
    r = raw(conn, lambda pg: pg.send_describe_prepared(b"chk"))
    check(f"chk after {command}", r.error_field(pq.DiagnosticField.SQLSTATE), b"26000")


def worker(w, stats, errs):
    try:
        with connect() as conn:
            for i in range(ITERS):
                check_deadline()
                k = key(w, i)
                got = one(conn, Q_DOUBLE, (k, f"w{w}-i{i}"), prepare=True)
                check("double", got, (2 * k, f"w{w}-i{i}"))
                txn(conn, w, i, pipelined=w % 2 == 1)
                if i % 7 == 3:
                    division_by_zero(conn, w, i)
                if i % 10 == 9:
                    reset(conn, i)
                stats[w] += 1
    except Exception as e:  # noqa: BLE001 - reported, then exit 1
        errs.append(f"worker {w}: {type(e).__name__}: {e}")


def run_threads(target, n, *args):
    errs = []
    threads = [threading.Thread(target=target, args=(j, *args, errs)) for j in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errs


def ddl_phase():
    """Prepare SELECT * on several connections, change the table, re-run."""
    conns = [connect() for _ in range(DDL_CONNS)]
    outcome = {"cached_plan_errors": 0, "recovered": 0, "of": DDL_CONNS}
    lock = threading.Lock()

    def warm(j, errs):
        try:
            for n in range(10):
                rid = 1 + (j * 10 + n) % 100
                check("star", one(conns[j], Q_STAR, (rid,), prepare=True), (rid, rid * 10))
                check("a", one(conns[j], Q_A, (rid,), prepare=True), (rid * 10,))
        except Exception as e:  # noqa: BLE001
            errs.append(f"ddl warm {j}: {type(e).__name__}: {e}")

    def after(j, errs):
        try:
            rid = 50 + j
            check("a after ddl", one(conns[j], Q_A, (rid,), prepare=True), (rid * 10,))
            for _ in range(DDL_ATTEMPTS):
                try:
                    got = one(conns[j], Q_STAR, (rid,), prepare=True)
                except errors.FeatureNotSupported as e:
                    if CACHED_PLAN not in str(e):
                        raise
                    with lock:
                        outcome["cached_plan_errors"] += 1
                    continue
                check("star after ddl", got, (rid, rid * 10, "x"))
                with lock:
                    outcome["recovered"] += 1
                break
        except Exception as e:  # noqa: BLE001
            errs.append(f"ddl after {j}: {type(e).__name__}: {e}")

    errs = run_threads(warm, DDL_CONNS)
    if not errs:
        conns[0].execute(DDL)
        errs = run_threads(after, DDL_CONNS)
    for c in conns:
        c.close()
    return outcome, errs


def main():
    stats = [0] * WORKERS
    errs = run_threads(worker, WORKERS, stats)
    ddl, ddl_errs = ({}, []) if errs else ddl_phase()
    errs += ddl_errs
    report(
        "psycopg",
        not errs,
        version=psycopg.__version__,
        workers=WORKERS,
        iterations=sum(stats),
        ddl=ddl,
        errors=errs[:5],
    )


if __name__ == "__main__":
    main()
