/** How planned values become the text of a request: percent-encoding, body bytes, auth labels. */
import type { AuthSpec } from './plan.js';
import { RawText } from './values.js';

export function encodeText(s: string): string {
  try {
    return encodeURIComponent(s);
  } catch {
    // Lone surrogates: send what UTF-8 makes of them.
    return [...Buffer.from(s, 'utf8')]
      .map((b) =>
        /[A-Za-z0-9\-_.~]/.test(String.fromCharCode(b))
          ? String.fromCharCode(b)
          : `%${b.toString(16).toUpperCase().padStart(2, '0')}`,
      )
      .join('');
  }
}

/** The body's bytes; with `bytes`, those go at the start of its first string value (invalid UTF-8). */
export function withBytes(text: string, bytes: number[] | undefined): Buffer {
  if (!bytes) return Buffer.from(text, 'utf8');
  const m = /:\s*"/.exec(text);
  if (!m) return Buffer.concat([Buffer.from('{"a":"'), Buffer.from(bytes), Buffer.from('"}')]);
  const at = m.index + m[0].length;
  return Buffer.concat([
    Buffer.from(text.slice(0, at), 'utf8'),
    Buffer.from(bytes),
    Buffer.from(text.slice(at), 'utf8'),
  ]);
}

/** A number as plain decimal digits (query values like 1e-7 are refused by the API's own rule). */
function plainNumber(n: number): string {
  if (!Number.isFinite(n)) return String(n);
  if (Number.isInteger(n)) return Math.abs(n) < 1e21 ? n.toFixed(0) : BigInt(n).toString();
  const s = String(n);
  return /e/i.test(s) ? n.toFixed(20).replace(/0+$/, '').replace(/\.$/, '') || '0' : s;
}

export function paramText(v: unknown): string {
  if (v instanceof RawText) return v.text;
  if (typeof v === 'number') return encodeText(plainNumber(v));
  const s =
    typeof v === 'string'
      ? v
      : v === null || v === undefined
        ? ''
        : typeof v === 'object'
          ? JSON.stringify(v)
          : String(v);
  return encodeText(s);
}

export function authLabel(a: AuthSpec): string {
  switch (a.kind) {
    case 'none':
      return 'anonymous';
    case 'as':
      return a.who;
    case 'tamper':
      return `${a.who}'s token, ${a.how}`;
    case 'raw':
      return `bogus credentials (${a.note})`;
  }
}
