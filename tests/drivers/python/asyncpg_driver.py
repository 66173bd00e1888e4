#!/usr/bin/env python3
"""asyncpg through a transaction pooler, with its default statement cache
(every query with arguments becomes a named statement `__asyncpg_stmt_N__`),
explicit conn.prepare() and executemany (Binds pipelined before one Sync).
Prints one JSON line; exits 1 on a wrong result or an unexpected error. The
scenario is described in tests/it/drivers.rs."""

import asyncio

import asyncpg
from asyncpg import exceptions as exc

from _common import (
    DDL, DDL_ATTEMPTS, DDL_CONNS, ITERS, Q_A, Q_COUNT, Q_DIV, Q_DOUBLE,
    Q_INSERT, Q_STAR, Q_VAL, TIMEOUT_S, WORKERS, Fail, check, check_deadline, dollar,
    key, params, report,
)

Q_DOUBLE, Q_INSERT, Q_VAL, Q_COUNT, Q_DIV, Q_STAR, Q_A = map(
    dollar, (Q_DOUBLE, Q_INSERT, Q_VAL, Q_COUNT, Q_DIV, Q_STAR, Q_A)
)
Q_APPEND = "UPDATE items SET val = val || $3 WHERE worker = $1 AND seq = $2"


async def connect():
    p = params()
    return await asyncpg.connect(
        host=p["host"], port=p["port"], user=p["user"], password=p["password"],
        database=p["dbname"], ssl=False, timeout=10,
    )


def tup(row):
    return None if row is None else tuple(row)


async def txn(conn, w, i):
    v = f"v{w}-{i}"
    async with conn.transaction():
        await conn.execute(Q_INSERT, w, i, v)
        check("val", tup(await conn.fetchrow(Q_VAL, w, i)), (v,))
        check("count", await conn.fetchval(Q_COUNT, w), i + 1)
        await conn.executemany(Q_APPEND, [(w, i, "a"), (w, i, "b"), (w, i, "c")])
        check("appended", await conn.fetchval(Q_VAL, w, i), v + "abc")


async def division_by_zero(conn, w, i):
    try:
        await conn.fetchval(Q_DIV, 0)
    except exc.DivisionByZeroError:
        pass
    else:
        raise Fail("100 / 0 did not fail")
    check("after error", await conn.fetchval(Q_DIV, 4), 25)
    if i % 14 != 3:
        return
    try:
        async with conn.transaction():
            k = key(w, i)
            check("in txn", tup(await conn.fetchrow(Q_DOUBLE, k, "t")), (2 * k, "t"))
            await conn.fetchval(Q_DIV, 0)
    except exc.DivisionByZeroError:
        pass
    else:
        raise Fail("100 / 0 in a transaction did not fail")
    check("count after rollback", await conn.fetchval(Q_COUNT, w), i + 1)


async def reset(conn, i):
    """DEALLOCATE ALL or DISCARD ALL from the client. asyncpg does not notice,
    so (as with PostgreSQL itself) its statements are gone and the application
    must drop asyncpg's cache (reload_schema_state)."""
    command = "DEALLOCATE ALL" if (i // 10) % 2 == 0 else "DISCARD ALL"
    ps = await conn.prepare("SELECT $1::int + 1")
    check("prepared", await ps.fetchval(1), 2)
    await conn.execute(command)
    try:
        await ps.fetchval(1)
    except exc.InvalidSQLStatementNameError:
        pass
    else:
        raise Fail(f"a prepared statement survived {command}")
    await conn.reload_schema_state()


async def worker(w, stats):
    conn = await connect()
    try:
        for i in range(ITERS):
            check_deadline()
            k = key(w, i)
            got = tup(await conn.fetchrow(Q_DOUBLE, k, f"w{w}-i{i}"))
            check("double", got, (2 * k, f"w{w}-i{i}"))
            await txn(conn, w, i)
            if i % 7 == 3:
                await division_by_zero(conn, w, i)
            if i % 10 == 9:
                await reset(conn, i)
            stats[w] += 1
    finally:
        await conn.close()


async def ddl_phase():
    conns = [await connect() for _ in range(DDL_CONNS)]
    outcome = {"cached_plan_errors": 0, "recovered": 0, "of": DDL_CONNS}

    async def warm(j):
        for n in range(10):
            rid = 1 + (j * 10 + n) % 100
            check("star", tup(await conns[j].fetchrow(Q_STAR, rid)), (rid, rid * 10))
            check("a", await conns[j].fetchval(Q_A, rid), rid * 10)

    async def after(j):
        rid = 50 + j
        check("a after ddl", await conns[j].fetchval(Q_A, rid), rid * 10)
        for _ in range(DDL_ATTEMPTS):
            try:
                got = tup(await conns[j].fetchrow(Q_STAR, rid))
            except exc.InvalidCachedStatementError:
                # "cached plan must not change result type", which asyncpg
                # retries once by itself (re-preparing under a new name).
                outcome["cached_plan_errors"] += 1
                continue
            check("star after ddl", got, (rid, rid * 10, "x"))
            outcome["recovered"] += 1
            break

    try:
        await asyncio.gather(*(warm(j) for j in range(DDL_CONNS)))
        await conns[0].execute(DDL)
        await asyncio.gather(*(after(j) for j in range(DDL_CONNS)))
    finally:
        for c in conns:
            await c.close()
    return outcome


async def main():
    stats = [0] * WORKERS
    errs = []
    ddl = {}

    async def guarded(coro, what):
        try:
            await coro
        except Exception as e:  # noqa: BLE001 - reported, then exit 1
            errs.append(f"{what}: {type(e).__name__}: {e}")

    async def scenario():
        nonlocal ddl
        await asyncio.gather(*(guarded(worker(w, stats), f"worker {w}") for w in range(WORKERS)))
        if not errs:
            try:
                ddl = await ddl_phase()
            except Exception as e:  # noqa: BLE001
                errs.append(f"ddl: {type(e).__name__}: {e}")

    try:
        await asyncio.wait_for(scenario(), TIMEOUT_S)
    except asyncio.TimeoutError:
        errs.append(f"over the {TIMEOUT_S:.0f} s time limit")
    report(
        "asyncpg",
        not errs,
        version=asyncpg.__version__,
        workers=WORKERS,
        iterations=sum(stats),
        ddl=ddl,
        errors=errs[:5],
    )


if __name__ == "__main__":
    asyncio.run(main())
