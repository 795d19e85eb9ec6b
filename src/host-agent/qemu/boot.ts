/**
 * When a booting VM becomes `running`: once its customer can log in and stay
 * logged in. Rules:
 *
 * - A guest that runs cloud-init is ready once cloud-init's final message,
 *   which the seed sets to a marker naming this VM's instance (`bootMarker`),
 *   has shown on its serial console during this run and SSH answers after
 *   that. cloud-init prints it at the very end of its final stage, after its
 *   config stage, whose password step restarts sshd (and cuts a login made
 *   before): the SSH banner alone comes a few seconds too early.
 * - Only this run's console counts: a `ConsoleScanner` reads the console's
 *   stream as the agent receives it, never the log file, which keeps earlier
 *   boots (cloud-init prints its final message at every boot).
 * - A guest whose console has not mentioned cloud-init by the time SSH has
 *   answered for `graceMs` (an image without cloud-init, or whose kernel does
 *   not write to the serial port) is ready when SSH answers, as it always was.
 * - A guest that mentions cloud-init but never prints the marker (an image
 *   whose cloud-init sends its output elsewhere) is ready `cloudInitWaitMs`
 *   after SSH first answered, so it still runs before the control plane's
 *   boot timeout.
 * - `running` survives an agent restart: the file `booted` in the VM's folder
 *   records it for the current run (removed with the run's other files).
 */
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** How long SSH must have answered before a guest that never mentioned cloud-init counts as ready. */
export const GRACE_MS = 3000;
/** How long after SSH first answered a guest that mentions cloud-init may take to print its marker. */
export const CLOUD_INIT_WAIT_MS = 120_000;
const POLL_MS = 250;
const CLOUD_INIT = 'cloud-init';

/** Watches one run's console stream for cloud-init and for the VM's boot marker. */
export class ConsoleScanner {
  /** Something on the console mentioned cloud-init (any case). */
  cloudInit = false;
  /** The boot marker has shown. */
  finished = false;
  private carry = '';
  private readonly keep: number;
  private listener: (() => void) | null = null;

  constructor(private readonly marker: string) {
    if (!marker) throw new TypeError('the boot marker must not be empty');
    this.keep = Math.max(marker.length, CLOUD_INIT.length) - 1;
  }

  /** Reads one chunk of console output (text may be split anywhere between chunks). */
  feed(chunk: Buffer | string): void {
    if (this.finished) return;
    const text = this.carry + (typeof chunk === 'string' ? chunk : chunk.toString('latin1'));
    const before = this.cloudInit;
    if (!this.cloudInit && text.toLowerCase().includes(CLOUD_INIT)) this.cloudInit = true;
    if (text.includes(this.marker)) {
      this.finished = true;
      this.cloudInit = true;
    }
    this.carry = text.slice(-this.keep);
    if (this.finished || this.cloudInit !== before) this.listener?.();
  }

  /** Waits `ms`, or less if what the scanner has seen changes meanwhile. */
  pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        if (this.listener === done) this.listener = null;
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.listener = done;
    });
  }
}

/** Why a guest counts as ready. */
export type BootReady = 'cloud-init' | 'ssh' | 'ssh-without-final-message';

export interface BootWait {
  scanner: ConsoleScanner;
  /** True when the guest's SSH server answers now (its banner was read). */
  sshAnswers: () => Promise<boolean>;
  /** False once the wait no longer matters: the VM stopped, another run began, the agent closes. */
  current: () => boolean;
  graceMs?: number;
  cloudInitWaitMs?: number;
  pollMs?: number;
  now?: () => number;
}

/** Waits until the guest is ready (see the rules above); null when the wait stopped mattering first. */
export async function waitForBoot(w: BootWait): Promise<BootReady | null> {
  const now = w.now ?? Date.now;
  const grace = w.graceMs ?? GRACE_MS;
  const cloudInitWait = w.cloudInitWaitMs ?? CLOUD_INIT_WAIT_MS;
  let firstAnswer: number | null = null;
  while (w.current()) {
    // The marker must have shown before the probe began: then this answer comes from the final sshd.
    const finished = w.scanner.finished;
    const answered = await w.sshAnswers();
    if (!w.current()) return null;
    if (answered) {
      if (finished) return 'cloud-init';
      if (w.scanner.finished) continue; // it showed during the probe: probe again at once
      firstAnswer ??= now();
      const since = now() - firstAnswer;
      if (!w.scanner.cloudInit && since >= grace) return 'ssh';
      if (w.scanner.cloudInit && since >= cloudInitWait) return 'ssh-without-final-message';
    }
    await w.scanner.pause(w.pollMs ?? POLL_MS);
  }
  return null;
}

/** The file that says the VM's current run is ready. */
export function bootedFile(vmDir: string): string {
  return join(vmDir, 'booted');
}

export function markBooted(vmDir: string, how: BootReady, at = new Date()): void {
  writeFileSync(bootedFile(vmDir), JSON.stringify({ at: at.toISOString(), how }) + '\n', { mode: 0o600 });
}

export function isBooted(vmDir: string): boolean {
  return existsSync(bootedFile(vmDir));
}
