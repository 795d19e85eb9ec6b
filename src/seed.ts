/**
 * Demo data (CONTRACT D44), seeded once: a demo user to log in with. Later
 * modules add their part (inventory, credit) to the same one-time seed.
 */
import type { Db } from './db/db.js';
import type { Services } from './app.js';

export interface DemoLogin {
  email: string;
  password: string;
}

export const DEMO_LOGIN: DemoLogin = { email: 'demo@gpucloud.local', password: 'demo-password-123' };

export async function seedDemo(db: Db, services: Services): Promise<DemoLogin> {
  const claimed = await db.query(`INSERT INTO seeds (name) VALUES ('demo') ON CONFLICT (name) DO NOTHING`);
  if (claimed.rowCount === 1) {
    await services.auth.ensureUser(DEMO_LOGIN.email, DEMO_LOGIN.password, 'user', 'Demo User');
  }
  return DEMO_LOGIN;
}
