/**
 * The repository explains itself: its code, tests and docs cite no document
 * outside it, and every link into docs/ (from a comment, a doc or the README)
 * names a file and a heading that exist, so a heading renamed without its
 * links fails here.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';

const ROOT = join(import.meta.dirname, '..');

function files(dir: string, ext: RegExp): string[] {
  return readdirSync(join(ROOT, dir)).flatMap((f) => {
    const p = join(dir, f);
    if (f === 'node_modules' || f === 'dist') return [];
    return statSync(join(ROOT, p)).isDirectory() ? files(p, ext) : ext.test(f) ? [p] : [];
  });
}

const sources = [
  ...files('src', /\.(ts|tsx)$/),
  ...files('test', /\.tsx?$/),
  ...files('console/src', /\.(ts|tsx)$/),
  ...files('bench', /\.ts$/),
  ...files('scripts', /\.(m?js|ts)$/),
];
const docs = ['README.md', ...files('docs', /\.md$/), ...files('test', /\.md$/)];
const read = (p: string) => readFileSync(join(ROOT, p), 'utf8');

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens. */
function slug(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/\s/g, '-');
}

function anchorsOf(doc: string): Set<string> {
  const seen = new Map<string, number>();
  const anchors = new Set<string>();
  let fenced = false;
  for (const line of read(doc).split('\n')) {
    if (line.startsWith('```')) fenced = !fenced;
    const m = !fenced && /^#{1,6}\s+(.*)$/.exec(line);
    if (!m) continue;
    const base = slug(m[1]!);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  return anchors;
}

test('no code, test or doc cites a decision number, an issue number or a document outside the repository', () => {
  const outside = /\bD\d{1,2}\b|CONTRACT\.md|shared\/(spec|design)\/|\bissue #\d+/;
  // This file names the patterns it looks for.
  const offenders = [...sources.filter((p) => p !== 'test/docs.test.ts'), ...docs].flatMap((p) =>
    read(p)
      .split('\n')
      .flatMap((line, i) => (outside.test(line) ? [`${p}:${i + 1}: ${line.trim().slice(0, 120)}`] : [])),
  );
  assert.deepEqual(offenders, []);
});

test('every link to docs/ names a file and a heading that exist', () => {
  const anchors = new Map<string, Set<string>>();
  const problems: string[] = [];
  const check = (from: string, target: string) => {
    const [path, anchor] = target.split('#') as [string, string | undefined];
    if (!existsSync(join(ROOT, path))) return problems.push(`${from}: ${target}: no such file`);
    if (!anchor || !path.endsWith('.md')) return;
    if (!anchors.has(path)) anchors.set(path, anchorsOf(path));
    if (!anchors.get(path)!.has(anchor)) problems.push(`${from}: ${target}: no such heading`);
  };
  // Comments and strings in code name docs by their path from the repository's root.
  for (const p of sources) {
    for (const m of read(p).matchAll(/\bdocs\/[\w-]+\.md(#[\w-]+)?/g)) check(p, m[0]);
  }
  // Markdown links are relative to the document.
  for (const p of docs) {
    for (const m of read(p).matchAll(/\]\(([^)\s]+)\)/g)) {
      const target = m[1]!;
      if (/^[a-z]+:/i.test(target)) continue; // http:, https:, mailto:
      const [path, anchor] = target.split('#');
      const resolved = path ? relative(ROOT, normalize(join(ROOT, dirname(p), path))) : p;
      check(p, anchor === undefined ? resolved : `${resolved}#${anchor}`);
    }
  }
  assert.deepEqual(problems, []);
});
