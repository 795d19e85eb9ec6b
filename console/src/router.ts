/**
 * Path routing under /console/: real URLs (the server answers every
 * /console/* path with the app), history.pushState for navigation.
 */
import { useEffect, useState } from 'preact/hooks';

export const BASE = '/console';

export function currentPath(): string {
  const p = location.pathname.startsWith(BASE) ? location.pathname.slice(BASE.length) : location.pathname;
  return p === '' ? '/' : p;
}

const listeners = new Set<() => void>();
window.addEventListener('popstate', () => listeners.forEach((f) => f()));

export function navigate(path: string, opts: { replace?: boolean } = {}): void {
  const url = BASE + path;
  if (opts.replace) history.replaceState(null, '', url);
  else history.pushState(null, '', url);
  listeners.forEach((f) => f());
  window.scrollTo(0, 0);
}

export function usePath(): string {
  const [path, setPath] = useState(currentPath());
  useEffect(() => {
    const f = () => setPath(currentPath());
    listeners.add(f);
    return () => listeners.delete(f);
  }, []);
  return path;
}

/** Matches `/vms/:id` against a path; the named parts, or undefined. */
export function match(pattern: string, path: string): Record<string, string> | undefined {
  const a = pattern.split('/');
  const b = path.split('/');
  if (a.length !== b.length) return undefined;
  const out: Record<string, string> = {};
  for (let i = 0; i < a.length; i++) {
    if (a[i]!.startsWith(':')) out[a[i]!.slice(1)] = decodeURIComponent(b[i]!);
    else if (a[i] !== b[i]) return undefined;
  }
  return out;
}
