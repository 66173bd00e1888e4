// node-postgres (`pg`) through a transaction pooler, with named queries
// ({name, text, values}): the first use of a name sends Parse, later uses only
// Bind/Execute. Prints one JSON line; exits 1 on a wrong result or an unexpected
// error. The scenario is described in tests/it/drivers.rs.
//
// Connection parameters: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE; workload:
// DRIVER_WORKERS, DRIVER_ITERS, DRIVER_TIMEOUT_S.
'use strict';

const pg = require('pg');

const WORKERS = Number(process.env.DRIVER_WORKERS || 12);
const ITERS = Number(process.env.DRIVER_ITERS || 40);
const TIMEOUT_S = Number(process.env.DRIVER_TIMEOUT_S || 120);
const DDL_CONNS = 4;
const DDL_ATTEMPTS = 5;
const START = Date.now();

const Q = {
  double: 'SELECT $1::int * 2 AS n, $2::text AS t',
  insert: 'INSERT INTO items (worker, seq, val) VALUES ($1, $2, $3)',
  val: 'SELECT val FROM items WHERE worker = $1 AND seq = $2',
  count: 'SELECT count(*)::int AS n FROM items WHERE worker = $1',
  bang: "UPDATE items SET val = val || '!' WHERE worker = $1 AND seq = $2",
  div: 'SELECT 100 / $1::int AS q',
  star: 'SELECT * FROM ddl_t WHERE id = $1',
  a: 'SELECT a FROM ddl_t WHERE id = $1',
};
const DDL = "ALTER TABLE ddl_t ADD COLUMN b text NOT NULL DEFAULT 'x'";

class Fail extends Error {}

function check(what, got, want) {
  const g = JSON.stringify(got);
  const w = JSON.stringify(want);
  if (g !== w) throw new Fail(`${what}: got ${g}, want ${w}`);
}

async function connect() {
  const c = new pg.Client({
    host: process.env.PGHOST,
    port: Number(process.env.PGPORT),
    user: process.env.PGUSER,
    password: process.env.PGPASSWORD,
    database: process.env.PGDATABASE,
    connectionTimeoutMillis: 10000,
  });
  await c.connect();
  return c;
}

// A named query; `epoch` changes the names after the client deallocated them all.
function named(conn, which, values) {
  return conn.c.query({ name: `${which}_${conn.epoch}`, text: Q[which], values });
}

async function expectError(promise, code, what) {
  try {
    await promise;
  } catch (e) {
    if (e.code === code) return;
    throw new Fail(`${what}: want SQLSTATE ${code}, got ${e.code} ${e.message}`);
  }
  throw new Fail(`${what}: no error`);
}

async function txn(conn, w, i) {
  const v = `v${w}-${i}`;
  await conn.c.query('BEGIN');
  await named(conn, 'insert', [w, i, v]);
  check('val', (await named(conn, 'val', [w, i])).rows, [{ val: v }]);
  check('count', (await named(conn, 'count', [w])).rows, [{ n: i + 1 }]);
  check('bang', (await named(conn, 'bang', [w, i])).rowCount, 1);
  await conn.c.query('COMMIT');
}

async function divisionByZero(conn, w, i) {
  await expectError(named(conn, 'div', [0]), '22012', '100 / 0');
  check('after error', (await named(conn, 'div', [4])).rows, [{ q: 25 }]);
  if (i % 14 !== 3) return;
  await conn.c.query('BEGIN');
  const k = w * 100000 + i;
  check('in txn', (await named(conn, 'double', [k, 't'])).rows, [{ n: 2 * k, t: 't' }]);
  await expectError(named(conn, 'div', [0]), '22012', '100 / 0 in a transaction');
  await conn.c.query('ROLLBACK');
  check('count after rollback', (await named(conn, 'count', [w])).rows, [{ n: i + 1 }]);
}

// DEALLOCATE ALL or DISCARD ALL from the client. node-pg does not notice: as with
// PostgreSQL itself, its names are gone (26000), so new names are used after.
async function reset(conn, w, i) {
  const command = Math.floor(i / 10) % 2 === 0 ? 'DEALLOCATE ALL' : 'DISCARD ALL';
  await conn.c.query(command);
  await expectError(named(conn, 'double', [1, 'x']), '26000', `old name after ${command}`);
  conn.epoch += 1;
}

async function worker(w, stats) {
  const conn = { c: await connect(), epoch: 0 };
  try {
    for (let i = 0; i < ITERS; i++) {
      if (Date.now() - START > TIMEOUT_S * 1000) throw new Fail('over the time limit');
      const k = w * 100000 + i;
      const r = await named(conn, 'double', [k, `w${w}-i${i}`]);
      check('double', r.rows, [{ n: 2 * k, t: `w${w}-i${i}` }]);
      await txn(conn, w, i);
      if (i % 7 === 3) await divisionByZero(conn, w, i);
      if (i % 10 === 9) await reset(conn, w, i);
      stats[w] += 1;
    }
  } finally {
    await conn.c.end();
  }
}

async function ddlPhase() {
  const conns = [];
  for (let j = 0; j < DDL_CONNS; j++) conns.push({ c: await connect(), epoch: 'ddl' });
  const outcome = { cached_plan_errors: 0, recovered: 0, of: DDL_CONNS };
  try {
    await Promise.all(conns.map(async (conn, j) => {
      for (let n = 0; n < 10; n++) {
        const id = 1 + ((j * 10 + n) % 100);
        check('star', (await named(conn, 'star', [id])).rows, [{ id, a: id * 10 }]);
        check('a', (await named(conn, 'a', [id])).rows, [{ a: id * 10 }]);
      }
    }));
    await conns[0].c.query(DDL);
    await Promise.all(conns.map(async (conn, j) => {
      const id = 50 + j;
      check('a after ddl', (await named(conn, 'a', [id])).rows, [{ a: id * 10 }]);
      for (let n = 0; n < DDL_ATTEMPTS; n++) {
        let r;
        try {
          r = await named(conn, 'star', [id]);
        } catch (e) {
          if (e.code !== '0A000') throw e;
          outcome.cached_plan_errors += 1;
          continue;
        }
        check('star after ddl', r.rows, [{ id, a: id * 10, b: 'x' }]);
        outcome.recovered += 1;
        break;
      }
    }));
  } finally {
    await Promise.all(conns.map((conn) => conn.c.end()));
  }
  return outcome;
}

async function main() {
  const stats = new Array(WORKERS).fill(0);
  const errors = [];
  let ddl = null;
  const timer = setTimeout(() => {
    console.log(JSON.stringify({ driver: 'node-pg', ok: false, errors: ['over the time limit'] }));
    process.exit(1);
  }, TIMEOUT_S * 1000);
  await Promise.all([...Array(WORKERS).keys()].map((w) => worker(w, stats).catch((e) => {
    errors.push(`worker ${w}: ${e.name}: ${e.message}`);
  })));
  if (errors.length === 0) {
    try {
      ddl = await ddlPhase();
    } catch (e) {
      errors.push(`ddl: ${e.name}: ${e.message}`);
    }
  }
  clearTimeout(timer);
  const ok = errors.length === 0;
  console.log(JSON.stringify({
    driver: 'node-pg',
    ok,
    version: require('pg/package.json').version,
    workers: WORKERS,
    iterations: stats.reduce((a, b) => a + b, 0),
    ddl,
    errors: errors.slice(0, 5),
    seconds: (Date.now() - START) / 1000,
  }));
  process.exitCode = ok ? 0 : 1;
}

main();
