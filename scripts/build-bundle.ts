/**
 * Bundles the built command (dist/main.js) into dist/bin/ (scripts/bundle.ts). Part of `npm run build`, after tsc.
 */
import { rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';
import { bundleOptions, ownImportMeta } from './bundle.js';

const dist = fileURLToPath(new URL('../dist/', import.meta.url));
const outdir = `${dist}bin`;
rmSync(outdir, { recursive: true, force: true });
await build({ ...bundleOptions({ gpucloud: `${dist}main.js` }, outdir), plugins: [ownImportMeta(outdir)] });
