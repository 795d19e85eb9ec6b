/**
 * A VM's serial console, kept on the host within a fixed size. Rules:
 *
 * - QEMU writes the guest's serial port to a unix socket it listens on
 *   (`con.sock`, `server=on,wait=off`), never to a file: while nobody reads
 *   the socket, QEMU drops what the guest writes, so a guest cannot fill the
 *   host's disk however much it prints, and an agent that is down keeps nothing.
 * - The agent reads the socket into `console.log`. Once that file reaches
 *   `capBytes` it becomes `console.log.1` (replacing the older one) and a new
 *   `console.log` begins: at most twice `capBytes` per VM, the newest output
 *   always kept.
 * - While the agent reads slowly, QEMU waits for it: the guest's serial port
 *   slows down, nothing else does.
 * - `ConsoleLog.tail` reads the last bytes of both files in order, for a
 *   caller that wants the end of a VM's console.
 * - `onData` listeners get each chunk as it arrives (the boot readiness
 *   watches the current run's output there: qemu/boot.ts).
 */
import net from 'node:net';
import { closeSync, existsSync, openSync, readFileSync, renameSync, statSync, writeSync } from 'node:fs';

/** What is kept of one VM's console: `console.log` and `console.log.1`, each up to this size. */
export const CONSOLE_CAP_BYTES = 1024 * 1024;

export class ConsoleLog {
  private socket: net.Socket | null = null;
  private fd: number | null = null;
  private size = 0;
  private closed = false;
  private readonly listeners: ((chunk: Buffer) => void)[] = [];

  constructor(
    private readonly socketPath: string,
    private readonly logPath: string,
    private readonly capBytes = CONSOLE_CAP_BYTES,
  ) {}

  /**
   * Connects to QEMU's console socket (a few tries: QEMU may still be setting
   * it up). Resolves true once connected, false when there is no socket to
   * read (an older VM, or QEMU ended); never throws.
   */
  async open(tries = 20): Promise<boolean> {
    for (let i = 0; i < tries && !this.closed; i++) {
      const socket = await new Promise<net.Socket | null>((resolve) => {
        const s = net.createConnection({ path: this.socketPath });
        s.once('connect', () => resolve(s));
        s.once('error', () => resolve(null));
      });
      if (socket) {
        if (this.closed) {
          socket.destroy();
          return false;
        }
        this.attach(socket);
        return true;
      }
      if (!existsSync(this.socketPath)) return false;
      await new Promise((r) => setTimeout(r, 100));
    }
    return false;
  }

  private attach(socket: net.Socket): void {
    this.socket = socket;
    this.fd = openSync(this.logPath, 'a', 0o600);
    this.size = statSync(this.logPath).size;
    socket.on('data', (chunk: Buffer) => this.write(chunk));
    socket.on('error', () => undefined);
    socket.on('close', () => this.close());
  }

  /** Calls `fn` with every chunk read from now on. */
  onData(fn: (chunk: Buffer) => void): void {
    this.listeners.push(fn);
  }

  private write(chunk: Buffer): void {
    for (const fn of this.listeners) fn(chunk);
    let rest = chunk;
    while (rest.length > 0 && this.fd !== null) {
      const room = this.capBytes - this.size;
      if (room <= 0) {
        this.rotate();
        continue;
      }
      const part = rest.subarray(0, room);
      writeSync(this.fd, part);
      this.size += part.length;
      rest = rest.subarray(part.length);
    }
  }

  private rotate(): void {
    closeSync(this.fd!);
    renameSync(this.logPath, `${this.logPath}.1`);
    this.fd = openSync(this.logPath, 'w', 0o600);
    this.size = 0;
  }

  /** Stops reading; QEMU then drops the console's output until someone reads again. */
  close(): void {
    this.closed = true;
    this.socket?.destroy();
    this.socket = null;
    if (this.fd !== null) closeSync(this.fd);
    this.fd = null;
  }

  /** The last `bytes` of a console log and its rotated predecessor, oldest first. */
  static tail(logPath: string, bytes: number): Buffer {
    const parts = [`${logPath}.1`, logPath].map((p) => (existsSync(p) ? readFileSync(p) : Buffer.alloc(0)));
    const all = Buffer.concat(parts);
    return all.subarray(Math.max(0, all.length - bytes));
  }
}
