/**
 * Route schemas compiled when a route first needs them, not when the app
 * starts. Fastify compiles a validator for every request part and a
 * serializer for every response status of every route before it listens;
 * for this API that was about a quarter of start-up, for routes an instance
 * may never serve. Each compiler here hands Fastify a stand-in that compiles
 * the real function on its first call and then only forwards to it.
 *
 * A schema that cannot compile therefore fails on first use instead of at
 * start-up; `compileAll()` compiles every pending one at once, which the
 * tests run so that a broken schema still fails the build.
 */
import SerializerSelector from '@fastify/fast-json-stringify-compiler';
import type { FastifySchemaCompiler, FastifyServerOptions } from 'fastify';
import type { FastifyValidationResult } from 'fastify/types/schema.js';

type SerializerFactory = SerializerSelector.SerializerFactory;

export class LazySchemas {
  private readonly pending = new Set<() => unknown>();

  /** Compiles every schema not compiled yet (their first use then finds them ready). */
  compileAll(): void {
    for (const compile of [...this.pending]) compile();
  }

  /** Schemas not compiled yet. */
  get pendingCount(): number {
    return this.pending.size;
  }

  /** `compile`, run once on the first call of the getter (or by compileAll); until then it is pending. */
  private deferred<T>(compile: () => T): () => T {
    let real: T | undefined;
    const get = (): T => {
      if (real === undefined) {
        real = compile();
        this.pending.delete(get);
      }
      return real;
    };
    this.pending.add(get);
    return get;
  }

  /** Wraps a validator compiler: the route's validator is compiled on its first request. */
  validator(compile: FastifySchemaCompiler<unknown>): FastifySchemaCompiler<unknown> {
    return (route) => {
      const real = this.deferred(() => compile(route));
      // Fastify calls the function, then reads `errors` from the function it called.
      const lazy: FastifyValidationResult = (data) => {
        const fn = real();
        const result = fn(data);
        lazy.errors = fn.errors;
        return result;
      };
      lazy.errors = null;
      return lazy;
    };
  }

  /** The serializer factory for Fastify's `schemaController`: fast-json-stringify, compiled on first reply. */
  serializerFactory(): SerializerFactory {
    const build = SerializerSelector();
    return (externalSchemas, options) => {
      const compile = build(externalSchemas, options);
      return (route) => {
        const real = this.deferred(() => compile(route));
        return (doc) => real()(doc);
      };
    };
  }

  /** Fastify's `schemaController` option with the lazy serializer. */
  schemaController(): NonNullable<FastifyServerOptions['schemaController']> {
    return { compilersFactory: { buildSerializer: this.serializerFactory() } };
  }
}
