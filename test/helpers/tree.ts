/** What a directory holds, to show that an operation left it exactly as it was. */
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';

/** Every path below `dir` with its kind, size and modification time, sorted. */
export function treeOf(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string, rel: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      const r = rel ? `${rel}/${e.name}` : e.name;
      const st = statSync(p);
      out.push(`${r} ${e.isDirectory() ? 'dir' : `${st.size} ${st.mtimeMs}`}`);
      if (e.isDirectory()) walk(p, r);
    }
  };
  walk(dir, '');
  return out.sort();
}
