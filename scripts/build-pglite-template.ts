/**
 * Packs the embedded database's template (src/db/template.ts) at
 * dist/pglite-template-<PGlite version>.tar.gz. Part of `npm run build`.
 */
import { packTemplate, templateFile } from '../src/db/template.js';

const file = templateFile();
if (!file) throw new Error('cannot find the installed @electric-sql/pglite');
const size = await packTemplate(file);
console.log(`embedded database template: ${file} (${(size / 1048576).toFixed(1)} MB)`);
