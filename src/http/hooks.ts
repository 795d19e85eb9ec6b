/**
 * Request hooks that cost next to nothing where they do not apply. An async
 * hook costs a promise and a turn of the microtask queue on every request it
 * sees; most of ours apply to a few routes (logins, idempotent creates) or
 * callers (signed-in ones), so they are callback hooks that check first and
 * start async work only when there is some.
 */
import type { FastifyReply, FastifyRequest, HookHandlerDoneFunction } from 'fastify';

type Done = HookHandlerDoneFunction;

/**
 * An onRequest or preValidation hook running `work` on the requests `applies`
 * to. When `work` answers the request itself, it returns the reply (as after
 * `return reply.send(...)`), and the request goes no further.
 */
export function hookWhen(
  applies: (req: FastifyRequest) => boolean,
  work: (req: FastifyRequest, reply: FastifyReply) => Promise<unknown>,
): (req: FastifyRequest, reply: FastifyReply, done: Done) => void {
  return (req, reply, done) => {
    if (!applies(req)) return done();
    work(req, reply).then(
      (result) => {
        if (result !== reply) done();
      },
      (err: Error) => done(err),
    );
  };
}

/** An onSend hook running `work` (which returns the payload to send) on the requests `applies` to. */
export function onSendWhen<P>(
  applies: (req: FastifyRequest) => boolean,
  work: (req: FastifyRequest, reply: FastifyReply, payload: P) => Promise<unknown>,
): (
  req: FastifyRequest,
  reply: FastifyReply,
  payload: P,
  done: (err: Error | null, payload?: unknown) => void,
) => void {
  return (req, reply, payload, done) => {
    if (!applies(req)) return done(null, payload);
    work(req, reply, payload).then(
      (next) => done(null, next),
      (err: Error) => done(err),
    );
  };
}
