/**
 * Request hooks that cost next to nothing where they do not apply. An async
 * hook costs a promise and a turn of the microtask queue on every request it
 * sees; most of ours apply to a few routes (logins, idempotent creates) or
 * callers (signed-in ones), so they are callback hooks that check first and
 * start async work only when there is some.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest, HookHandlerDoneFunction, RouteOptions } from 'fastify';

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

type RouteHookName = 'preValidation' | 'onSend';
/** One hook of the kind route options take under `name` (they take one or a list). */
type RouteHook<K extends RouteHookName> =
  NonNullable<RouteOptions[K]> extends infer H ? (H extends readonly (infer E)[] ? E : H) : never;

/**
 * Adds `hook` as a route-level `name` hook to each route added from now on that
 * `applies` to, decided once when the route is added: a request to any other
 * route does not run it at all. Route-level hooks run after the application's
 * hooks of the same kind, in the order they were added here.
 */
export function addRouteHook<K extends RouteHookName>(
  app: FastifyInstance,
  name: K,
  applies: (route: RouteOptions) => boolean,
  hook: RouteHook<K>,
): void {
  app.addHook('onRoute', (route) => {
    if (!applies(route)) return;
    const existing: unknown = route[name];
    const hooks = existing === undefined ? [] : Array.isArray(existing) ? [...(existing as unknown[])] : [existing];
    hooks.push(hook);
    (route as Record<K, unknown>)[name] = hooks;
  });
}
