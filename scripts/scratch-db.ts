/**
 * A throw-away PostgreSQL database for a run that needs its own (the fuzzer,
 * the soak, the crash and multi-instance tests): CREATE DATABASE
 * <prefix>_<random> on the server of `serverUrl`; drop() removes it, ending
 * whatever is still connected to it.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';

export interface ScratchDatabase {
  name: string;
  url: string;
  drop(): Promise<void>;
}

async function onServer(serverUrl: string, sql: string): Promise<void> {
  const c = new pg.Client({ connectionString: serverUrl });
  await c.connect();
  try {
    await c.query(sql);
  } finally {
    await c.end();
  }
}

export async function createScratchDatabase(serverUrl: string, prefix: string): Promise<ScratchDatabase> {
  if (!/^[a-z][a-z0-9_]{0,40}$/.test(prefix)) throw new Error(`bad scratch database prefix ${JSON.stringify(prefix)}`);
  const name = `${prefix}_${randomBytes(6).toString('hex')}`;
  await onServer(serverUrl, `CREATE DATABASE ${name}`);
  const u = new URL(serverUrl);
  u.pathname = `/${name}`;
  return { name, url: u.toString(), drop: () => onServer(serverUrl, `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`) };
}
