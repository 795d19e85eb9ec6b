/**
 * Password hashing with argon2id at OWASP's parameters (19 MiB, t=2, p=1),
 * per-user salt. A semaphore bounds how many hashes run at once so a
 * login flood cannot exhaust memory; past a bounded queue it refuses with 429.
 */
import { hash, verify, Algorithm } from '@node-rs/argon2';
import { AppError } from '../../errors.js';

const OPTIONS = { algorithm: Algorithm.Argon2id, memoryCost: 19_456, timeCost: 2, parallelism: 1 } as const;

/**
 * The cost a test suite may choose (GPUCLOUD_PASSWORD_HASH_COST=test, which
 * the configuration refuses under NODE_ENV=production): 1 MiB and one pass,
 * about 2 ms instead of 45, so a suite's time goes to behaviour. Hashes made
 * either way verify either way: the parameters travel in the hash.
 */
const TEST_OPTIONS = { algorithm: Algorithm.Argon2id, memoryCost: 1024, timeCost: 1, parallelism: 1 } as const;

export type PasswordHashCost = 'standard' | 'test';

/**
 * A fixed argon2id hash with exactly OPTIONS' parameters (of a throwaway
 * password), verified against for unknown emails so that they cost one verify
 * like a known email. It is a constant rather than computed on first use,
 * which made the first unknown-email login pay a hash plus a verify: a timing
 * tell. test/auth/accounts.test.ts checks that its parameters match OPTIONS.
 */
export const DUMMY_HASH =
  '$argon2id$v=19$m=19456,t=2,p=1$HZ7GB94vG06SmCGhOPKWlw$8BjgZfKBVqyrvWeLfYndmTmF6NOJRK2WZhH/43hMG+8';
/** The same, at the test cost. */
const TEST_DUMMY_HASH =
  '$argon2id$v=19$m=1024,t=1,p=1$vDDSTeCotjtANdtANPiSyQ$AjAfzJw2lev/apCgs62+57zEihw8e7SpInWg0IBK0u8';

export class PasswordHasher {
  private running = 0;
  private readonly waiting: Array<() => void> = [];

  private readonly options: typeof OPTIONS | typeof TEST_OPTIONS;
  /** What unknown emails are verified against: a hash with the parameters this hasher makes. */
  readonly dummyHash: string;

  constructor(
    private readonly concurrency: number,
    private readonly maxQueue = 256,
    cost: PasswordHashCost = 'standard',
  ) {
    this.options = cost === 'test' ? TEST_OPTIONS : OPTIONS;
    this.dummyHash = cost === 'test' ? TEST_DUMMY_HASH : DUMMY_HASH;
  }

  private async slot<T>(fn: () => Promise<T>): Promise<T> {
    if (this.running >= this.concurrency) {
      if (this.waiting.length >= this.maxQueue) {
        throw new AppError(
          'rate_limited',
          'The server is busy checking passwords; try again in a few seconds',
          undefined,
          {
            'retry-after': '2',
          },
        );
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
    return this.slot(() => hash(password, this.options));
  }

  /** Constant-time comparison inside argon2; a malformed stored hash is simply "no". */
  verify(storedHash: string, password: string): Promise<boolean> {
    return this.slot(() => verify(storedHash, password).catch(() => false));
  }

  /**
   * Spends the same time as a real verify, for unknown emails: login timing does not tell whether an account exists.
   */
  async verifyDummy(password: string): Promise<false> {
    await this.verify(this.dummyHash, password);
    return false;
  }
}
