/**
 * The embedded database belongs to one process: a second one opening the
 * same files would corrupt them. A server holding a data directory says so
 * in DATA_DIR/server.pid (its pid), written when it opens the database and
 * removed when it closes it; another `serve` on that directory, and
 * `gpucloud restore`, refuse while that process is alive. A file left by a
 * process that died (SIGKILL, a crash) names no live process and is taken over.
 */
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';

export const PID_FILE = 'server.pid';

/** Whether the process `pid` is alive (a zombie, already dead but not yet reaped, is not). */
export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    // EPERM: it exists, as another user's process.
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return true; // no /proc (not Linux): kill() said it exists
  }
}

/** The pid of the live process that holds `dataDir`, or undefined. */
export function dataDirHolder(dataDir: string): number | undefined {
  let text: string;
  try {
    text = readFileSync(join(resolve(dataDir), PID_FILE), 'utf8').trim();
  } catch {
    return undefined;
  }
  const pid = Number(text);
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(pid) || pid <= 0) return undefined;
  return processAlive(pid) ? pid : undefined;
}

/** Another live process holds the data directory. */
export class DataDirInUse extends Error {
  constructor(
    readonly dataDir: string,
    readonly pid: number,
  ) {
    super(
      `${dataDir} is in use by another gpucloud server (pid ${pid}): the embedded database belongs to one process. ` +
        `Stop that one first; if no gpucloud runs there, remove ${join(dataDir, PID_FILE)}`,
    );
    this.name = 'DataDirInUse';
  }
}

/**
 * Marks `dataDir` as held by this process, or throws DataDirInUse when another live one holds it (this process
 * too: a second server in it would corrupt the files the same way). Returns what releases it.
 */
export function holdDataDir(dataDir: string): () => void {
  const dir = resolve(dataDir);
  const file = join(dir, PID_FILE);
  const own = String(process.pid);
  for (let attempt = 0; ; attempt++) {
    try {
      writeFileSync(file, `${own}\n`, { flag: 'wx', mode: 0o600 });
      break;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      const holder = dataDirHolder(dir);
      if (holder !== undefined) throw new DataDirInUse(dir, holder);
      if (attempt > 0) throw err;
      rmSync(file, { force: true }); // left by a process that is gone
    }
  }
  return () => {
    try {
      if (readFileSync(file, 'utf8').trim() === own) rmSync(file, { force: true });
    } catch {
      // already gone
    }
  };
}
