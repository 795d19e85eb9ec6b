/**
 * The values a planned request carries before it is sent: plain JSON plus a
 * few markers: `Ref` (a real object's id, looked up when the request is
 * sent), `RawJson` (text spliced into a JSON body as is: 1e400, duplicate
 * keys, ...) and `RawText` (an already percent-encoded path segment or query
 * value).
 */

export type PoolKind = 'vm' | 'sshkey' | 'apikey' | 'user' | 'credential' | 'node' | 'reservation' | 'refresh';

/** A real object from a pool: `pool[index % pool.length][field]`. */
export class Ref {
  constructor(
    readonly kind: PoolKind,
    readonly index: number,
    readonly field: string = 'id',
  ) {}
  toString(): string {
    return `<${this.kind}#${this.index}.${this.field}>`;
  }
}

/** JSON text written into a body as is. */
export class RawJson {
  constructor(readonly text: string) {}
}

/** A path segment or query value sent exactly as written (already percent-encoded). */
export class RawText {
  constructor(readonly text: string) {}
}

/** An object property set even when its name is `__proto__`. */
export function setOwn(o: Record<string, unknown>, key: string, value: unknown): Record<string, unknown> {
  Object.defineProperty(o, key, { value, enumerable: true, writable: true, configurable: true });
  return o;
}

export function isPlainObject(v: unknown): v is Record<string, unknown> {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return false;
  if (v instanceof Ref || v instanceof RawJson || v instanceof RawText || v instanceof Uint8Array) return false;
  return true;
}

/** JSON text of a value that may hold RawJson markers (Refs must be resolved first). */
export function toJsonText(v: unknown): string {
  if (v instanceof RawJson) return v.text;
  if (v instanceof Ref) throw new Error(`unresolved ${v.toString()}`);
  if (v instanceof RawText) return JSON.stringify(v.text);
  if (Array.isArray(v)) return `[${v.map((x) => (x === undefined ? 'null' : toJsonText(x))).join(',')}]`;
  if (isPlainObject(v)) {
    const parts: string[] = [];
    for (const k of Object.keys(v)) {
      const x = v[k];
      if (x === undefined) continue;
      parts.push(`${JSON.stringify(k)}:${toJsonText(x)}`);
    }
    return `{${parts.join(',')}}`;
  }
  if (v === undefined) return 'null';
  return JSON.stringify(v);
}

/** A copy of `v` with every Ref replaced by `lookup(ref)`. */
export function resolveRefs(v: unknown, lookup: (r: Ref) => unknown): unknown {
  if (v instanceof Ref) return lookup(v);
  if (Array.isArray(v)) return v.map((x) => resolveRefs(x, lookup));
  if (isPlainObject(v)) {
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(v)) setOwn(out, k, resolveRefs(v[k], lookup));
    return out;
  }
  return v;
}

/** Does the value hold a Ref anywhere? */
export function hasRef(v: unknown): boolean {
  if (v instanceof Ref) return true;
  if (Array.isArray(v)) return v.some(hasRef);
  if (isPlainObject(v)) return Object.values(v).some(hasRef);
  return false;
}

const UNPRINTABLE =
  // eslint-disable-next-line no-control-regex -- control characters are what this looks for
  /[\u0000-\u001f\u007f-\u009f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;

/** A short printable rendering for reports: control, invisible and lone surrogate characters as \uXXXX. */
export function snippet(text: string, max = 300): string {
  const cut = text.length > max ? text.slice(0, max) : text;
  const s = cut.replace(UNPRINTABLE, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
  return text.length > max ? `${s}... (${text.length} chars)` : s;
}
