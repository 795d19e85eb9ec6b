/** /admin/users, /admin/clock, /admin/ledger-check and /admin/backup: the admin role only. */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { DateTime, errorResponses, Nullable, page, PaginationQuery, paging } from '../../http/schemas.js';
import { requirePrincipal } from '../../http/principal.js';
import type { AdminUserService } from './service.js';
import { AdminUserSchema } from './schemas.js';
import type { ClockService } from '../clock/service.js';
import type { LedgerProblem } from '../billing/ledger-check.js';
import type { Config } from '../../config.js';
import { PgliteDb, type Db } from '../../db/db.js';
import { backupFileName, createBackup } from '../../db/backup.js';
import { invalidState } from '../../errors.js';

const UserId = Type.Object({
  user_id: Type.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER, description: "The user's id" }),
});

export function adminRoutes(
  app: FastifyInstance,
  users: AdminUserService,
  clock: ClockService,
  ledgerCheck: () => Promise<LedgerProblem[]>,
  store: { db: Db; config: Pick<Config, 'dataDir' | 'jwtSecret'> },
): void {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const admin = { auth: 'admin', scopes: [], cache: 'no-store' } as const;

  r.get(
    '/admin/users',
    {
      schema: {
        tags: ['admin'],
        operationId: 'listUsers',
        summary: 'List users',
        description: '`email` filters by substring, case-insensitively. Newest first; X-Total-Count holds the total.',
        querystring: Type.Object(
          {
            email: Type.Optional(
              Type.String({
                maxLength: 254,
                description: 'Only users whose email contains this text (case-insensitive)',
              }),
            ),
            ...PaginationQuery,
          },
          { additionalProperties: false },
        ),
        response: { 200: Type.Array(AdminUserSchema), ...errorResponses(401, 403, 422, 429) },
      },
      config: admin,
    },
    async (req, reply) => page(reply, await users.list({ ...req.query, ...paging(req.query) })),
  );

  r.get(
    '/admin/users/:user_id',
    {
      schema: {
        tags: ['admin'],
        operationId: 'getUser',
        summary: 'Get a user',
        description:
          'One account as an operator sees it: role, balance, suspension and the per-user VM and GPU limits. Admin role.',
        params: UserId,
        response: { 200: AdminUserSchema, ...errorResponses(401, 403, 404, 422, 429) },
      },
      config: admin,
    },
    async (req) => users.get(req.params.user_id),
  );

  r.patch(
    '/admin/users/:user_id',
    {
      schema: {
        tags: ['admin'],
        operationId: 'updateUser',
        summary: 'Change role, suspension or limits of a user',
        description:
          'A suspended user gets 403 on every call and its running VMs are stopped. `max_vms` / `max_gpus` override the defaults (10 VMs, 16 GPUs); null restores them. Administrators cannot suspend or demote themselves.',
        params: UserId,
        body: Type.Object(
          {
            role: Type.Optional(Type.Union([Type.Literal('user'), Type.Literal('admin')])),
            suspended: Type.Optional(Type.Boolean()),
            max_vms: Type.Optional(Nullable(Type.Integer({ minimum: 0, maximum: 10_000 }))),
            max_gpus: Type.Optional(Nullable(Type.Integer({ minimum: 0, maximum: 100_000 }))),
          },
          {
            additionalProperties: false,
            minProperties: 1,
            examples: [{ suspended: true }, { max_vms: 20, max_gpus: 32 }],
          },
        ),
        response: { 200: AdminUserSchema, ...errorResponses(400, 401, 403, 404, 415, 422, 429) },
      },
      config: admin,
    },
    async (req) => users.patch(requirePrincipal(req.principal).userId, req.params.user_id, req.body),
  );

  const ClockNow = Type.Object(
    { now: DateTime('The service clock') },
    { examples: [{ now: '2026-11-22T10:00:00.000Z' }] },
  );

  r.get(
    '/admin/clock',
    {
      schema: {
        tags: ['admin'],
        operationId: 'getClock',
        summary: 'The service clock',
        description:
          'The time every time-driven job follows: real time, or with GPUCLOUD_CLOCK=manual the persisted manual clock.',
        response: { 200: ClockNow, ...errorResponses(401, 403, 429) },
      },
      config: admin,
    },
    // Another instance may have advanced the manual clock: read the persisted value.
    async () => ({ now: (await clock.sync()).toISOString() }),
  );

  r.post(
    '/admin/clock/advance',
    {
      schema: {
        tags: ['admin'],
        operationId: 'advanceClock',
        summary: 'Advance the manual clock',
        description:
          'Only with GPUCLOUD_CLOCK=manual (else 400 `invalid_state`). Moves service time forward and returns after every job that came due has run. An advance that would close more than 300,000 billing periods at once (VMs that accrue times the boundaries crossed) is refused with 400 `limit_exceeded` before the clock moves; the message names the largest advance accepted.',
        body: Type.Object(
          { seconds: Type.Integer({ minimum: 1, maximum: 10 * 366 * 86_400 }) },
          { additionalProperties: false, examples: [{ seconds: 3600 }] },
        ),
        response: { 200: ClockNow, ...errorResponses(400, 401, 403, 415, 422, 429) },
      },
      config: admin,
    },
    async (req) => ({ now: (await clock.advance(req.body.seconds)).toISOString() }),
  );

  const LedgerCheck = Type.Object(
    {
      ok: Type.Boolean({ description: 'True when no problem was found' }),
      checked_at: DateTime('When the check ran (the service clock)'),
      problems: Type.Array(
        Type.Object({
          kind: Type.Union([
            Type.Literal('balance'),
            Type.Literal('transaction'),
            Type.Literal('reservation'),
            Type.Literal('usage'),
            Type.Literal('coverage'),
          ]),
          user_id: Type.Integer(),
          email: Type.String(),
          detail: Type.String(),
        }),
      ),
    },
    { examples: [{ ok: true, checked_at: '2026-11-22T10:00:00.000Z', problems: [] }] },
  );

  r.get(
    '/admin/ledger-check',
    {
      schema: {
        tags: ['admin'],
        operationId: 'checkLedger',
        summary: 'Verify the ledger',
        description:
          "The check `gpucloud admin ledger-check` runs, over the whole database: every balance equals the sum of its transactions, every transaction's balance_after is the running sum, every reservation's remaining balance and its deposit and refund transactions agree, every usage log's cost was paid exactly once, and every VM's usage periods cover its billable time with no gap and no overlap (naming the VM and the span). Each problem names the account. Admin role.",
        response: { 200: LedgerCheck, ...errorResponses(401, 403, 429) },
      },
      config: admin,
    },
    async () => {
      const problems = await ledgerCheck();
      return { ok: problems.length === 0, checked_at: clock.clock.now().toISOString(), problems };
    },
  );

  r.get(
    '/admin/backup',
    {
      schema: {
        tags: ['admin'],
        operationId: 'backupDatabase',
        summary: 'Back up the embedded database',
        description:
          'A consistent copy of the embedded database, taken while the service runs: its files are copied between two transactions (requests wait only for the copy itself, a fraction of a second on a small database), so every change committed before the request is in it. The answer is a gzipped tar archive (offered as `gpucloud-backup-<UTC time>.tar.gz`) holding a manifest (`gpucloud-backup.json`: the release, the PGlite version, the time, the migrations applied), the generated signing secret of the data directory (not when GPUCLOUD_JWT_SECRET is set: the manifest says so), and the database files under `pg/`. It holds every account and secret of the service: keep it as safe as the data directory. `gpucloud backup FILE` saves one, `gpucloud restore FILE` brings it back into a stopped service. On PostgreSQL (DATABASE_URL) 400 `invalid_state`: back that up with pg_dump or base backups. Admin role.',
        response: {
          200: {
            description: 'The backup: a gzipped tar archive',
            content: { 'application/gzip': { schema: Type.Unsafe<Buffer>({ type: 'string', format: 'binary' }) } },
          },
          ...errorResponses(400, 401, 403, 429),
        },
      },
      config: admin,
    },
    async (_req, reply) => {
      const { db, config } = store;
      if (!(db instanceof PgliteDb))
        throw invalidState(
          'The service runs on PostgreSQL (DATABASE_URL): back it up with pg_dump or base backups and WAL archiving (docs/operations.md#backups)',
        );
      const { archive, manifest } = await createBackup(db, {
        dataDir: config.dataDir,
        secretFromEnvironment: config.jwtSecret !== undefined,
      });
      return reply
        .header('content-type', 'application/gzip')
        .header('content-disposition', `attachment; filename="${backupFileName(new Date(manifest.created_at))}"`)
        .send(archive);
    },
  );
}
