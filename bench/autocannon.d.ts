/**
 * The part of autocannon's programmatic API that bench/load.ts uses
 * (autocannon ships no types, and @types/autocannon lags behind it).
 * Nothing to run: the compiler reads it with the rest of bench/.
 */
declare module 'autocannon' {
  import type { EventEmitter } from 'node:events';

  namespace autocannon {
    type Context = Record<string, unknown>;

    interface RawRequest {
      method?: string;
      path?: string;
      headers?: Record<string, string>;
      body?: string;
    }

    interface Request extends RawRequest {
      /** Returns the request to send, or a falsy value to restart from the first request (a `reset`). */
      setupRequest?: (req: RawRequest, context: Context) => RawRequest | undefined | null | false;
      onResponse?: (status: number, body: string, context: Context, headers: Record<string, string>) => void;
    }

    interface Options {
      url: string;
      connections?: number;
      duration?: number;
      timeout?: number;
      method?: string;
      headers?: Record<string, string>;
      body?: string;
      requests?: Request[];
    }

    interface Result {
      duration: number;
      errors: number;
      timeouts: number;
      non2xx: number;
      resets: number;
      statusCodeStats: Record<string, { count: number }>;
      requests: { total: number; average: number };
    }

    interface Instance extends EventEmitter, PromiseLike<Result> {
      stop(): void;
      on(
        event: 'response',
        listener: (client: unknown, statusCode: number, resBytes: number, responseTime: number) => void,
      ): this;
      on(event: string, listener: (...args: unknown[]) => void): this;
    }
  }

  function autocannon(opts: autocannon.Options): autocannon.Instance;
  export = autocannon;
}
