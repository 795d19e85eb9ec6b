/**
 * `runFuzz(options)`: fuzzes the API from its served OpenAPI document.
 *
 * Starts a server (unless given a URL), reads /openapi.json, sets up
 * identities and real objects, sends a seeded plan of valid and broken
 * requests (a few in flight at once), and checks every response against the
 * document: no 5xx, only documented statuses, bodies matching the documented
 * schemas.
 */
import { randomBytes } from 'node:crypto';
import { appendFileSync, writeFileSync } from 'node:fs';
import { FAILURE_KINDS, type Failure, type FailureKind } from './checker.js';
import { Fuzzer } from './fuzzer.js';
import { HttpClient } from './http.js';
import { type OpenApiDoc, parseOperations } from './openapi.js';
import { docFingerprint, makePlan } from './plan.js';
import { FUZZ_ADMIN_EMAIL, type StartedServer, startServer } from './server.js';

export interface FuzzOptions {
  /** Planned requests to send (default 3000). */
  requests?: number;
  /** fast-check seed (default: random; printed for replay). */
  seed?: number;
  /** Which database the started server uses (default embedded). Ignored with `url`. */
  db?: 'embedded' | 'postgres';
  /** Fuzz a running server instead of starting one (needs its admin login). */
  url?: string;
  adminEmail?: string;
  adminPassword?: string;
  /** Requests in flight at most (default 8). */
  concurrency?: number;
  /** Only operations whose id ("POST /vms") contains this text. */
  only?: string;
  /** LOG_LEVEL of the started server (default silent); its output is kept for the report. */
  serverLogLevel?: string;
  databaseUrl?: string;
  timeoutMs?: number;
  /** Write every planned request and its response (shortened) to this file, one JSON object per line. */
  trace?: string;
  /** Progress lines (default: none). */
  log?: (line: string) => void;
}

export interface FuzzResult {
  requests: number;
  /** Every request sent, harness ones (setup, repairs) included. */
  checked: number;
  seed: number;
  db: string;
  counts: Record<FailureKind, number>;
  failures: Failure[];
  durationMs: number;
  /** The one-line summary: fuzz: requests=... 5xx=... undocumented=... schema_mismatch=... seed=... db=... */
  summary: string;
  /** Summary, examples per failure kind, the distinct causes and a replay hint. */
  report: string;
  ok: boolean;
  /** Status counts per operation. */
  statuses: Record<string, Record<string, number>>;
  /** The server's last output lines (started servers only). */
  serverOutput: string;
}

// ---------------------------------------------------------------- report

function pickExamples(failures: Failure[], kind: FailureKind, max: number): Failure[] {
  const of = failures.filter((f) => f.kind === kind);
  const byGroup = new Map<string, Failure[]>();
  for (const f of of) byGroup.set(f.group, [...(byGroup.get(f.group) ?? []), f]);
  const out: Failure[] = [];
  // One per distinct cause first, then more of the same.
  for (let round = 0; out.length < max && round < max; round++) {
    for (const fs of byGroup.values()) {
      if (out.length >= max) break;
      if (fs[round]) out.push(fs[round]!);
    }
  }
  return out;
}

function causes(failures: Failure[], kind: FailureKind): string[] {
  const byGroup = new Map<string, { n: number; f: Failure }>();
  for (const f of failures.filter((x) => x.kind === kind)) {
    const g = byGroup.get(f.group);
    if (g) g.n++;
    else byGroup.set(f.group, { n: 1, f });
  }
  return [...byGroup.values()]
    .sort((a, b) => b.n - a.n)
    .map(
      ({ n, f }) =>
        `    ${String(n).padStart(4)} x ${f.op} -> ${f.status}${f.group.split('|')[3] ? ` [${f.group.split('|')[3]}]` : ''}`,
    );
}

export function formatReport(
  r: Omit<FuzzResult, 'report' | 'summary' | 'ok'> & { summary: string },
  replay: string,
): string {
  const lines = [r.summary];
  for (const kind of FAILURE_KINDS) {
    if (!r.counts[kind]) continue;
    lines.push('', `${kind}: ${r.counts[kind]} (distinct causes: kind, operation, status, code or first schema error)`);
    lines.push(...causes(r.failures, kind));
    lines.push(`  examples:`);
    pickExamples(r.failures, kind, 10).forEach((f, i) => {
      lines.push(
        `  ${i + 1}. ${f.method} ${f.url} -> ${f.status}   as ${f.identity}   #${f.seq < 0 ? 'harness' : f.seq}`,
      );
      lines.push(`     input:    ${f.input}`);
      if (f.requestBody) lines.push(`     request:  ${f.requestBody}`);
      lines.push(`     response: ${f.response}`);
      if (f.detail)
        lines.push(...f.detail.split('\n').map((d) => `     ${kind === 'undocumented' ? '' : 'problem:  '}${d}`));
    });
  }
  if (!FAILURE_KINDS.every((k) => r.counts[k] === 0)) lines.push('', `replay: ${replay}`);
  return lines.join('\n');
}

// ---------------------------------------------------------------- entry

export async function runFuzz(options: FuzzOptions = {}): Promise<FuzzResult> {
  const requests = options.requests ?? 3000;
  const seed = options.seed ?? randomBytes(4).readUInt32BE(0) >>> 1;
  const concurrency = options.concurrency ?? 8;
  const log = options.log ?? (() => {});
  const dbLabel = options.url ? 'external' : (options.db ?? 'embedded');
  const t0 = performance.now();

  let server: StartedServer | undefined;
  let baseUrl = options.url;
  let admin = {
    email: options.adminEmail ?? process.env.GPUCLOUD_ADMIN_EMAIL ?? FUZZ_ADMIN_EMAIL,
    password: options.adminPassword ?? process.env.GPUCLOUD_ADMIN_PASSWORD ?? '',
  };
  if (!baseUrl) {
    log(`fuzz: starting a server (${dbLabel})`);
    server = await startServer({
      db: options.db ?? 'embedded',
      databaseUrl: options.databaseUrl,
      logLevel: options.serverLogLevel,
    });
    baseUrl = server.url;
    admin = { email: server.adminEmail, password: server.adminPassword };
    log(`fuzz: server at ${baseUrl} after ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  }
  const http = new HttpClient(baseUrl, concurrency, options.timeoutMs ?? 30_000);
  try {
    const docRes = await http.send({ method: 'GET', path: '/openapi.json', headers: [], body: undefined });
    if (docRes.status !== 200)
      throw new Error(
        `GET /openapi.json answered ${docRes.status}: ${docRes.error ?? docRes.body.toString('utf8').slice(0, 200)}`,
      );
    const doc = JSON.parse(docRes.body.toString('utf8')) as OpenApiDoc;
    const allOps = parseOperations(doc);
    const ops = options.only ? allOps.filter((o) => o.id.includes(options.only!)) : allOps;
    if (!ops.length) throw new Error(`no operation matches --only ${options.only}`);
    const plan = makePlan(ops, seed, requests);
    log(
      `fuzz: ${ops.length} operations (document ${docFingerprint(ops)}), ${plan.filter((p) => p.mode === 'invalid').length} of ${plan.length} requests invalid, seed ${seed}`,
    );

    const fz = new Fuzzer(http, allOps, ops, admin, seed, log);
    if (options.trace) {
      const file = options.trace;
      writeFileSync(file, '');
      fz.trace = (e) => appendFileSync(file, JSON.stringify(e) + '\n');
    }
    await fz.setup();
    log(`fuzz: setup done after ${((performance.now() - t0) / 1000).toFixed(1)} s`);
    await fz.runPlanned(plan, concurrency, 250, server);
    if (server?.exited()) {
      fz.checker.counts['5xx']++;
      fz.checker.failures.push({
        kind: '5xx',
        op: '(server)',
        method: '-',
        url: '-',
        status: 0,
        identity: '-',
        input: '-',
        requestBody: '',
        seq: -1,
        response: server.output().slice(-1500),
        detail: `the server ${server.exited()} during the run`,
        group: '5xx|(server)|0|exit',
      });
    }

    const counts = fz.checker.counts;
    const durationMs = performance.now() - t0;
    const summary = `fuzz: requests=${fz.sent} 5xx=${counts['5xx']} undocumented=${counts.undocumented} schema_mismatch=${counts.schema_mismatch} seed=${seed} db=${dbLabel}`;
    const statuses: Record<string, Record<string, number>> = {};
    for (const [op, m] of fz.checker.seen)
      statuses[op] = Object.fromEntries([...m.entries()].map(([s, n]) => [String(s), n]));
    const replayArgs = [
      `--requests ${requests}`,
      `--seed ${seed}`,
      options.url ? `--url ${options.url}` : `--db ${dbLabel}`,
      options.only ? `--only '${options.only}'` : '',
      concurrency !== 8 ? `--concurrency ${concurrency}` : '',
    ]
      .filter(Boolean)
      .join(' ');
    const base = {
      requests: fz.sent,
      checked: fz.checker.checked,
      seed,
      db: dbLabel,
      counts: { ...counts },
      failures: fz.checker.failures,
      durationMs,
      statuses,
      serverOutput: server?.output() ?? '',
      summary,
    };
    const report = formatReport(
      base,
      `npm run fuzz -- ${replayArgs}   (the same requests in the same order; --concurrency 1 also fixes the order in which they land)`,
    );
    log(
      `fuzz: ${fz.sent} requests (+${fz.checker.checked - fz.sent} of setup/repair${fz.skipped ? `, ${fz.skipped} the client could not send` : ''}) in ${(durationMs / 1000).toFixed(1)} s` +
        (http.retries ? `; ${http.retries} sent again after the server closed a keep-alive connection under them` : ''),
    );
    return { ...base, report, ok: FAILURE_KINDS.every((k) => counts[k] === 0) };
  } finally {
    http.close();
    await server?.stop();
  }
}

export { FAILURE_KINDS };
export type { Failure, FailureKind };
