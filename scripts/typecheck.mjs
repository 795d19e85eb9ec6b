// `npm run typecheck`: the service, tests and scripts (tsconfig.json) and the web console (console/tsconfig.json),
// checked by two tsc processes at once; fails when either finds an error.
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';

const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
const run = (args) =>
  new Promise((resolve) => {
    spawn(process.execPath, [tsc, ...args], { stdio: 'inherit' }).on('exit', (code) => resolve(code ?? 1));
  });
const codes = await Promise.all([run(['--noEmit', '-p', 'tsconfig.json']), run(['-p', 'console/tsconfig.json'])]);
process.exit(codes.every((c) => c === 0) ? 0 : 1);
