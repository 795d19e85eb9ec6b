/**
 * The one log of every gpucloud process (the API, the workers, the portal,
 * the host agent): pino, one JSON object a line, or, when the output is a
 * terminal, one readable line an event (docs/configuration.md#logs):
 *
 *   14:02:11.532 INFO  GET /vms 200 3.1 ms  reqId=2f6c… user=7
 *
 * `GPUCLOUD_LOG_FORMAT` (auto, json, pretty) overrides the choice. Requests
 * are logged once each, when answered (app.ts), at info.
 */
import { pino, type Logger } from 'pino';

export type LogFormat = 'auto' | 'json' | 'pretty';

const LEVELS: Record<number, string> = { 10: 'TRACE', 20: 'DEBUG', 30: 'INFO', 40: 'WARN', 50: 'ERROR', 60: 'FATAL' };
const OMIT = new Set(['level', 'time', 'msg', 'pid', 'hostname']);

function value(v: unknown): string {
  if (typeof v === 'string') return /[\s"=]/.test(v) || v === '' ? JSON.stringify(v) : v;
  if (v instanceof Object && 'message' in v && typeof (v as { message: unknown }).message === 'string')
    return JSON.stringify((v as { message: string }).message);
  return JSON.stringify(v);
}

/** One JSON log line as a person reads it: local time, level, message, then key=value pairs. */
export function prettyLine(json: string): string {
  let o: Record<string, unknown>;
  try {
    o = JSON.parse(json) as Record<string, unknown>;
  } catch {
    return json.endsWith('\n') ? json : `${json}\n`;
  }
  const t = typeof o.time === 'number' ? new Date(o.time) : new Date();
  const time = `${String(t.getHours()).padStart(2, '0')}:${String(t.getMinutes()).padStart(2, '0')}:${String(
    t.getSeconds(),
  ).padStart(2, '0')}.${String(t.getMilliseconds()).padStart(3, '0')}`;
  const level = (LEVELS[o.level as number] ?? String(o.level)).padEnd(5);
  const rest = Object.entries(o)
    .filter(([k, v]) => !OMIT.has(k) && v !== undefined)
    .map(([k, v]) => `${k}=${value(v)}`)
    .join(' ');
  const err = o.err as { stack?: unknown } | undefined;
  const stack = typeof err?.stack === 'string' && (o.level as number) >= 50 ? `\n${err.stack}` : '';
  return `${time} ${level} ${String(o.msg ?? '')}${rest ? `  ${rest}` : ''}${stack}\n`;
}

/** The log of this process: to stdout (fd 1) or stderr (fd 2), JSON or readable lines. */
export function createLogger(opts: { level: string; format?: LogFormat; fd?: 1 | 2; name?: string }): Logger {
  const fd = opts.fd ?? 1;
  const out = fd === 1 ? process.stdout : process.stderr;
  const format = opts.format ?? 'auto';
  const pretty = format === 'pretty' || (format === 'auto' && out.isTTY === true);
  const base = { level: opts.level, ...(opts.name ? { name: opts.name } : {}) };
  if (!pretty) return pino(base, pino.destination(fd));
  return pino(base, { write: (line: string) => void out.write(prettyLine(line)) });
}
