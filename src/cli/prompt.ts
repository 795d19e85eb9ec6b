/**
 * Questions to the user: on a TTY through readline (passwords hidden); from a
 * pipe, one line of stdin per question.
 */
import { createInterface } from 'node:readline';

let piped: Promise<string[]> | undefined;

async function pipedLines(): Promise<string[]> {
  piped ??= (async () => {
    const chunks: Buffer[] = [];
    for await (const c of process.stdin) chunks.push(c as Buffer);
    return Buffer.concat(chunks).toString('utf8').split(/\r?\n/);
  })();
  return piped;
}

export function interactive(): boolean {
  return !!process.stdin.isTTY;
}

/** One answer, or undefined when stdin has no more lines. Prompts go to stderr. */
export async function ask(question: string, opts: { hidden?: boolean } = {}): Promise<string | undefined> {
  if (!process.stdin.isTTY) {
    const lines = await pipedLines();
    const line = lines.shift();
    if (line === undefined || (line === '' && lines.length === 0)) return undefined;
    return line.trim();
  }
  const rl = createInterface({ input: process.stdin, output: process.stderr, terminal: true });
  const internals = rl as unknown as { _writeToOutput?: (s: string) => void };
  return new Promise<string>((resolve) => {
    process.stderr.write(question);
    if (opts.hidden) internals._writeToOutput = () => {};
    rl.question('', (answer) => {
      rl.close();
      if (opts.hidden) process.stderr.write('\n');
      resolve(answer.trim());
    });
  });
}

/** y/N. */
export async function confirm(question: string): Promise<boolean> {
  const a = await ask(`${question} [y/N] `);
  return a !== undefined && /^y(es)?$/i.test(a);
}
