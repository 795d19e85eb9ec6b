/**
 * A QMP client on a unix socket (QEMU Machine Protocol, newline-delimited
 * JSON). The rules it follows:
 *
 * - A connection is ready only after QEMU's greeting and a successful
 *   `qmp_capabilities`; `connect` gives up after `timeoutMs` (default 5 s).
 *   QEMU serves one client at a time and greets a second one only when the
 *   first has gone, so a second concurrent `connect` times out: keep one
 *   client per VM, owned by one process.
 * - Every command carries a fresh numeric `id`; replies are matched by it, so
 *   events may arrive between a command and its reply. A reply with `error`
 *   rejects with `QmpError` (QEMU's class in `qmpClass`); a command without a
 *   reply within its timeout (default 10 s) rejects with
 *   `QmpConnectionError('timeout')` and its late reply is ignored.
 * - When the socket closes (QEMU quit or was killed, or `close()`), every
 *   pending command rejects with `QmpConnectionError('closed')`, later
 *   commands reject at once, and the `onClose` callbacks run once. A
 *   callback registered after the close runs on the next tick.
 * - A line that is not a JSON object, or a line longer than 16 MiB, means the
 *   peer is not QMP: the connection is closed.
 * - Exceptions thrown by callbacks do not stop the reader; they are rethrown
 *   on the next tick so they still surface as uncaught errors.
 */
import net from 'node:net';

export interface QmpEvent {
  event: string;
  data?: unknown;
  timestamp?: unknown;
}

/** QEMU answered a command with `{"error": {"class", "desc"}}`. */
export class QmpError extends Error {
  constructor(
    readonly qmpClass: string,
    readonly desc: string,
    readonly command: string,
  ) {
    super(`QMP ${command}: ${qmpClass}: ${desc}`);
    this.name = 'QmpError';
  }
}

/** No answer: the connection closed, or the command or handshake timed out. */
export class QmpConnectionError extends Error {
  constructor(
    readonly reason: 'closed' | 'timeout',
    message: string,
  ) {
    super(message);
    this.name = 'QmpConnectionError';
  }
}

const MAX_LINE = 16 * 1024 * 1024;
const DEFAULT_CONNECT_TIMEOUT_MS = 5_000;
const DEFAULT_COMMAND_TIMEOUT_MS = 10_000;

interface Pending {
  command: string;
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
}

type Message = Record<string, unknown>;

export class QmpClient {
  private buf = '';
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private readonly eventCbs: Array<(ev: QmpEvent) => void> = [];
  private readonly closeCbs: Array<() => void> = [];
  private isClosed = false;
  private lastError: Error | null = null;
  /** Receives raw messages until the handshake is over. */
  private handshake: ((msg: Message) => void) | null = null;

  private constructor(private readonly socket: net.Socket) {
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => this.onData(chunk));
    socket.on('error', (err) => {
      this.lastError = err;
      this.shutdown();
    });
    socket.on('close', () => this.shutdown());
  }

  /** Connects, waits for the greeting and negotiates capabilities. */
  static connect(socketPath: string, opts: { timeoutMs?: number } = {}): Promise<QmpClient> {
    const timeoutMs = opts.timeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS;
    return new Promise<QmpClient>((resolve, reject) => {
      const client = new QmpClient(net.createConnection({ path: socketPath }));
      let done = false;
      const fail = (err: Error): void => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        client.handshake = null;
        client.close();
        reject(err);
      };
      const timer = setTimeout(
        () =>
          fail(
            new QmpConnectionError(
              'timeout',
              `QMP ${socketPath}: no greeting within ${timeoutMs} ms (another client connected?)`,
            ),
          ),
        timeoutMs,
      );
      client.onClose(() =>
        fail(
          new QmpConnectionError(
            'closed',
            `QMP ${socketPath}: ${client.lastError?.message ?? 'connection closed during handshake'}`,
          ),
        ),
      );
      client.handshake = (msg) => {
        if (!('QMP' in msg)) return fail(new QmpConnectionError('closed', `QMP ${socketPath}: unexpected greeting`));
        client.handshake = null;
        client.execute('qmp_capabilities', undefined, { timeoutMs }).then(
          () => {
            if (done) return;
            done = true;
            clearTimeout(timer);
            resolve(client);
          },
          (err: Error) => fail(err),
        );
      };
    });
  }

  get closed(): boolean {
    return this.isClosed;
  }

  /** Runs a command; resolves with its `return` value. */
  execute<T = unknown>(command: string, args?: Record<string, unknown>, opts: { timeoutMs?: number } = {}): Promise<T> {
    if (this.isClosed) return Promise.reject(new QmpConnectionError('closed', `QMP ${command}: connection closed`));
    const id = this.nextId++;
    const timeoutMs = opts.timeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new QmpConnectionError('timeout', `QMP ${command}: no reply within ${timeoutMs} ms`));
      }, timeoutMs);
      this.pending.set(id, { command, resolve: resolve as (v: unknown) => void, reject, timer });
      const msg: Message = { execute: command, id };
      if (args !== undefined) msg.arguments = args;
      this.socket.write(JSON.stringify(msg) + '\n');
    });
  }

  onEvent(cb: (ev: QmpEvent) => void): void {
    this.eventCbs.push(cb);
  }

  onClose(cb: () => void): void {
    if (this.isClosed) process.nextTick(() => cb());
    else this.closeCbs.push(cb);
  }

  close(): void {
    this.socket.destroy();
    this.shutdown();
  }

  private onData(chunk: string): void {
    this.buf += chunk;
    let nl: number;
    while (!this.isClosed && (nl = this.buf.indexOf('\n')) >= 0) {
      const line = this.buf.slice(0, nl).trim();
      this.buf = this.buf.slice(nl + 1);
      if (line) this.onLine(line);
    }
    if (this.buf.length > MAX_LINE) this.close();
  }

  private onLine(line: string): void {
    let msg: unknown;
    try {
      msg = JSON.parse(line);
    } catch {
      return this.close();
    }
    if (typeof msg !== 'object' || msg === null || Array.isArray(msg)) return this.close();
    const m = msg as Message;
    if (this.handshake) return this.handshake(m);
    if (typeof m.event === 'string') {
      const ev: QmpEvent = { event: m.event, data: m.data, timestamp: m.timestamp };
      for (const cb of this.eventCbs) guarded(() => cb(ev));
      return;
    }
    if (typeof m.id !== 'number') return;
    const p = this.pending.get(m.id);
    if (!p) return;
    this.pending.delete(m.id);
    clearTimeout(p.timer);
    if ('error' in m) {
      const e = (m.error ?? {}) as { class?: unknown; desc?: unknown };
      p.reject(new QmpError(String(e.class ?? 'GenericError'), String(e.desc ?? ''), p.command));
    } else {
      p.resolve(m.return);
    }
  }

  private shutdown(): void {
    if (this.isClosed) return;
    this.isClosed = true;
    this.socket.destroy();
    for (const [id, p] of this.pending) {
      this.pending.delete(id);
      clearTimeout(p.timer);
      p.reject(new QmpConnectionError('closed', `QMP ${p.command}: connection closed`));
    }
    for (const cb of this.closeCbs.splice(0)) guarded(cb);
  }
}

function guarded(fn: () => void): void {
  try {
    fn();
  } catch (err) {
    process.nextTick(() => {
      throw err;
    });
  }
}
