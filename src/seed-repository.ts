/** The only SQL of the `seeds` table: which one-time seeds (the demo data) are done. */
import type { Queryable } from './db/db.js';

export async function isSeeded(q: Queryable, name: string): Promise<boolean> {
  return (await q.query('SELECT 1 FROM seeds WHERE name = $1', [name])).rows.length > 0;
}

export async function markSeeded(q: Queryable, name: string): Promise<void> {
  await q.query('INSERT INTO seeds (name) VALUES ($1) ON CONFLICT (name) DO NOTHING', [name]);
}
