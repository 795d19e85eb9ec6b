/**
 * A baseline server for `npm run bench`: bare Fastify 5 doing the least an
 * endpoint must do, so the service's figures have something to be compared
 * with. bench/http.ts starts it as a child process (the load generator and
 * the server are separate processes, as with the service). Modes:
 *   hello   GET /hello answers {"hello":"world"}
 *   static  GET /search answers, from memory, the file BENCH_STATIC_FILE
 *           (the body the service returned for GET /search)
 *   db      the essential query of each endpoint, on BENCH_DATABASE_URL
 *           (a pg Pool of 10, like the service's) or on the embedded data
 *           dir BENCH_PGLITE_DIR (PGlite, once the service has exited), for
 *           the user BENCH_USER_ID:
 *             GET /vms/:id          one select by primary key
 *             GET /vms              the user's 50 newest VMs (the columns a list reads)
 *             GET /billing/balance  the balance select
 *             GET /search           the 3 queries /search and /pricing run
 *                                   (prices, nodes, GPUs held per node)
 * By hand: BENCH_STATIC_FILE=body.json node --import tsx bench/baseline-server.ts static
 * It prints "  API:   http://127.0.0.1:PORT" when it listens, like gpucloud serve.
 */
import { readFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import Fastify, { type FastifyInstance } from 'fastify';
import pg from 'pg';
import { PGlite } from '@electric-sql/pglite';
import { LISTED_COLUMNS } from '../src/modules/vms/listed-repository.js';

type Mode = 'hello' | 'static' | 'db';

interface Sql {
  rows(text: string, params?: unknown[]): Promise<unknown[]>;
  close(): Promise<void>;
}

function env(name: string): string {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
}

async function openSql(): Promise<Sql> {
  const url = process.env.BENCH_DATABASE_URL;
  if (url) {
    const pool = new pg.Pool({ connectionString: url, max: 10 });
    return { rows: async (text, params) => (await pool.query(text, params)).rows, close: () => pool.end() };
  }
  const db = await PGlite.create({ dataDir: env('BENCH_PGLITE_DIR') });
  return { rows: async (text, params) => (await db.query(text, params)).rows, close: () => db.close() };
}

function helloRoutes(app: FastifyInstance): void {
  app.get('/hello', async () => ({ hello: 'world' }));
}

function staticRoutes(app: FastifyInstance): void {
  const body = readFileSync(env('BENCH_STATIC_FILE'));
  app.get('/search', (_req, reply) => reply.type('application/json; charset=utf-8').send(body));
}

async function dbRoutes(app: FastifyInstance): Promise<void> {
  const sql = await openSql();
  app.addHook('onClose', () => sql.close());
  const userId = Number(env('BENCH_USER_ID'));
  app.get<{ Params: { id: string } }>(
    '/vms/:id',
    async (req) => (await sql.rows('SELECT * FROM vms WHERE id = $1 AND user_id = $2', [req.params.id, userId]))[0],
  );
  app.get('/vms', async () =>
    sql.rows(
      `SELECT ${LISTED_COLUMNS.join(', ')} FROM vms WHERE user_id = $1 AND status <> 'destroyed' ORDER BY seq DESC LIMIT 50`,
      [userId],
    ),
  );
  app.get(
    '/billing/balance',
    async () => (await sql.rows('SELECT balance_micros FROM balances WHERE user_id = $1', [userId]))[0],
  );
  app.get('/search', async () => {
    const [prices, nodes, usage] = await Promise.all([
      sql.rows(`SELECT * FROM gpu_pricing ORDER BY array_position(ARRAY['5090','4090','pro6000'], gpu_type)`),
      sql.rows('SELECT * FROM nodes ORDER BY node'),
      sql.rows(
        `SELECT node, COALESCE(SUM(gpu_count), 0)::int8 AS held,
                COALESCE(SUM(gpu_count) FILTER (WHERE rental_type = 'interruptible' AND status = ANY($1::text[])), 0)::int8 AS preemptible
           FROM vms WHERE holds_gpus GROUP BY node`,
        [['creating', 'starting', 'running']],
      ),
    ]);
    return { prices, nodes, usage };
  });
}

async function main(): Promise<void> {
  const mode = process.argv[2] as Mode;
  const app = Fastify();
  if (mode === 'hello') helloRoutes(app);
  else if (mode === 'static') staticRoutes(app);
  else if (mode === 'db') await dbRoutes(app);
  else throw new Error(`usage: baseline-server.ts hello|static|db (got ${String(mode)})`);
  await app.listen({ host: '127.0.0.1', port: 0 });
  console.log(`  API:   http://127.0.0.1:${(app.server.address() as AddressInfo).port}`);
  for (const signal of ['SIGINT', 'SIGTERM'] as const)
    process.once(signal, () => void app.close().then(() => process.exit(0)));
}

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.message : err);
  process.exit(1);
});
