/**
 * What a bench run must undo whatever happens: child servers, scratch
 * databases, temporary directories. A case opens a Scope; each thing it makes
 * is deferred to the scope and undone in reverse order when the case ends,
 * when it fails, or on Ctrl-C / SIGTERM (releaseOnSignals, installed by
 * bench/run.ts). Used by the bench's cases, not run on its own.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export type Release = () => Promise<void>;

/** Every release not yet run, whichever scope deferred it (for the signal handler). */
const pending = new Set<Release>();

const message = (err: unknown) => (err instanceof Error ? err.message : String(err));

async function runAll(releases: Release[]): Promise<void> {
  for (const release of releases.reverse()) {
    await release().catch((err: unknown) => console.error(`cleanup: ${message(err)}`));
  }
}

export class Scope {
  private readonly mine: Release[] = [];

  /** Keeps `undo` for the end of the scope; the function returned runs it now instead (once). */
  defer(undo: () => Promise<void> | void): Release {
    let done: Promise<void> | undefined;
    const release: Release = () => {
      pending.delete(release);
      done ??= Promise.resolve().then(undo);
      return done;
    };
    pending.add(release);
    this.mine.push(release);
    return release;
  }

  /** A new temporary directory, removed with the scope. */
  tempDir(): string {
    const dir = mkdtempSync(join(tmpdir(), 'gpucloud-bench-'));
    this.defer(() => rmSync(dir, { recursive: true, force: true }));
    return dir;
  }

  close(): Promise<void> {
    return runAll([...this.mine]);
  }
}

/** Runs `fn` with a scope that is closed however `fn` ends. */
export async function withScope<T>(fn: (scope: Scope) => Promise<T>): Promise<T> {
  const scope = new Scope();
  try {
    return await fn(scope);
  } finally {
    await scope.close();
  }
}

/** On Ctrl-C or SIGTERM: undo everything still pending, then exit 130. */
export function releaseOnSignals(): void {
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => {
      console.error(`\n${signal}: stopping the servers and dropping the scratch databases`);
      void runAll([...pending]).finally(() => process.exit(130));
    });
  }
}
