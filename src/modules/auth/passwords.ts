/**
 * Password hashing with argon2id at OWASP's parameters (19 MiB, t=2, p=1),
 * per-user salt (D11). A semaphore bounds how many hashes run at once so a
 * login flood cannot exhaust memory; past a bounded queue it refuses with 429.
 */
import { hash, verify, Algorithm } from '@node-rs/argon2';
import { AppError } from '../../errors.js';

const OPTIONS = { algorithm: Algorithm.Argon2id, memoryCost: 19_456, timeCost: 2, parallelism: 1 } as const;

/**
 * A fixed argon2id hash with exactly OPTIONS' parameters (of a throwaway
 * password), verified against for unknown emails so that they cost one verify
 * like a known email (D11). It is a constant rather than computed on first use,
 * which made the first unknown-email login pay a hash plus a verify: a timing
 * tell. test/auth/accounts.test.ts checks that its parameters match OPTIONS.
 */
export const DUMMY_HASH = '$argon2id$v=19$m=19456,t=2,p=1$HZ7GB94vG06SmCGhOPKWlw$8BjgZfKBVqyrvWeLfYndmTmF6NOJRK2WZhH/43hMG+8';

export class PasswordHasher {
  private running = 0;
  private readonly waiting: Array<() => void> = [];

  constructor(
    private readonly concurrency: number,
    private readonly maxQueue = 256,
  ) {}

  private async slot<T>(fn: () => Promise<T>): Promise<T> {
    if (this.running >= this.concurrency) {
      if (this.waiting.length >= this.maxQueue) {
        throw new AppError('rate_limited', 'The server is busy checking passwords; try again in a few seconds', undefined, {
          'retry-after': '2',
        });
      }
      await new Promise<void>((resolve) => this.waiting.push(resolve));
    } else {
      this.running++;
    }
    try {
      return await fn();
    } finally {
      const next = this.waiting.shift();
      if (next) next();
      else this.running--;
    }
  }

  hash(password: string): Promise<string> {
    return this.slot(() => hash(password, OPTIONS));
  }

  /** Constant-time comparison inside argon2; a malformed stored hash is simply "no". */
  verify(storedHash: string, password: string): Promise<boolean> {
    return this.slot(() => verify(storedHash, password).catch(() => false));
  }

  /** Spends the same time as a real verify, for unknown emails (D11). */
  async verifyDummy(password: string): Promise<false> {
    await this.verify(DUMMY_HASH, password);
    return false;
  }
}
