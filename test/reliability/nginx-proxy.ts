/**
 * Helpers of test/reliability/nginx.test.ts: a real nginx (the Debian
 * package) as a child process with its own configuration, a throwaway CA and
 * server certificate made with openssl, and a small HTTPS client that trusts
 * that CA and can choose its source address (127.0.0.2, 127.0.0.3...).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import { connect, createServer } from 'node:net';
import { join } from 'node:path';

/** The nginx binary: on PATH, or where Debian puts it (/usr/sbin is not on every PATH). */
export function findNginx(): string | null {
  for (const bin of ['nginx', '/usr/sbin/nginx']) {
    const r = spawnSync(bin, ['-v'], { encoding: 'utf8' });
    if (r.status === 0) return bin;
  }
  return null;
}

/** A port nothing listens on right now (the kernel's choice, released at once). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const addr = s.address();
      const port = typeof addr === 'object' && addr ? addr.port : 0;
      s.close(() => resolve(port));
    });
  });
}

function openssl(dir: string, args: string[]): void {
  const r = spawnSync('openssl', args, { cwd: dir, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`openssl ${args.join(' ')} failed:\n${r.stderr}`);
}

/**
 * A CA and a server certificate (signed by it) for localhost, 127.0.0.1 and `*.<wildcard>` in `dir`.
 * Returns the CA's PEM for clients to trust, and the paths nginx needs.
 */
export function makeCertificates(dir: string, wildcard: string): { ca: string; cert: string; key: string } {
  openssl(dir, ['genrsa', '-out', 'ca.key', '2048']);
  openssl(dir, [
    'req',
    '-x509',
    '-new',
    '-key',
    'ca.key',
    '-sha256',
    '-days',
    '2',
    '-subj',
    '/CN=gpucloud test CA',
    '-out',
    'ca.crt',
  ]);
  openssl(dir, ['genrsa', '-out', 'server.key', '2048']);
  openssl(dir, ['req', '-new', '-key', 'server.key', '-subj', '/CN=localhost', '-out', 'server.csr']);
  writeFileSync(
    join(dir, 'server.ext'),
    [
      'basicConstraints = CA:FALSE',
      'keyUsage = digitalSignature, keyEncipherment',
      'extendedKeyUsage = serverAuth',
      `subjectAltName = DNS:localhost, DNS:*.${wildcard}, IP:127.0.0.1`,
      '',
    ].join('\n'),
  );
  openssl(dir, [
    'x509',
    '-req',
    '-in',
    'server.csr',
    '-CA',
    'ca.crt',
    '-CAkey',
    'ca.key',
    '-CAcreateserial',
    '-days',
    '2',
    '-sha256',
    '-extfile',
    'server.ext',
    '-out',
    'server.crt',
  ]);
  return { ca: readFileSync(join(dir, 'ca.crt'), 'utf8'), cert: join(dir, 'server.crt'), key: join(dir, 'server.key') };
}

export interface NginxOptions {
  dir: string;
  port: number;
  upstreams: number[];
  cert: string;
  key: string;
}

/**
 * The configuration under test: docs/operations.md's, plus what a rolling restart and the access portal need.
 * - `keepalive` to the upstreams (HTTP/1.1, `Connection` cleared unless upgrading), closed by nginx after 4 s,
 *   before the service's own 5 s keep-alive timeout, so that nginx does not send a request on a connection the
 *   service is closing as idle;
 * - `proxy_next_upstream error timeout http_503`: a refused connection or a 503 (an instance that is stopping)
 *   is retried on the other instance. nginx retries a request it already sent only for idempotent methods (not
 *   POST, PATCH, LOCK); `non_idempotent` is left out on purpose: a POST that reached an instance may have been
 *   acted on, and only the client knows whether it is safe to repeat (an Idempotency-Key): the client retries;
 * - `max_fails=1 fail_timeout=2s`: an instance that refused is skipped for 2 s (the test waits longer than that
 *   between restarts, as an operator would wait for /readyz);
 * - `Upgrade`/`Connection` passed on for WebSockets (the access portal), `proxy_buffering off` for event streams.
 */
export function nginxConfig(o: NginxOptions): string {
  const root = typeof process.getuid === 'function' && process.getuid() === 0;
  const d = o.dir;
  return `# written by test/reliability/nginx-proxy.ts
${root ? 'user root;' : ''}
worker_processes 1;
pid ${d}/nginx.pid;
error_log ${d}/error.log warn;
events { worker_connections 512; }
http {
  log_format up '$remote_addr "$request" $status up=$upstream_addr upstatus=$upstream_status rt=$request_time xff="$http_x_forwarded_for"';
  access_log ${d}/access.log up;
  client_body_temp_path ${d}/tmp/body;
  proxy_temp_path ${d}/tmp/proxy;
  fastcgi_temp_path ${d}/tmp/fastcgi;
  uwsgi_temp_path ${d}/tmp/uwsgi;
  scgi_temp_path ${d}/tmp/scgi;
  map $http_upgrade $connection_upgrade { default upgrade; '' ''; }
  upstream gpucloud {
${o.upstreams.map((p) => `    server 127.0.0.1:${p} max_fails=1 fail_timeout=2s;`).join('\n')}
    keepalive 16;
    keepalive_timeout 4s;
  }
  server {
    listen 127.0.0.1:${o.port} ssl;
    server_name _;
    ssl_certificate ${o.cert};
    ssl_certificate_key ${o.key};
    location / {
      proxy_pass http://gpucloud;
      proxy_http_version 1.1;
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection $connection_upgrade;
      proxy_buffering off;
      proxy_read_timeout 1h;
      proxy_connect_timeout 2s;
      proxy_next_upstream error timeout http_503;
    }
  }
}
`;
}

export interface Nginx {
  child: ChildProcess;
  output: () => string;
  errorLog: () => string;
  accessLog: () => string;
  stop(): Promise<void>;
}

/** Writes the configuration, checks it with `nginx -t`, starts nginx and waits until it accepts connections. */
export async function startNginx(bin: string, o: NginxOptions): Promise<Nginx> {
  for (const t of ['body', 'proxy', 'fastcgi', 'uwsgi', 'scgi']) mkdirSync(join(o.dir, 'tmp', t), { recursive: true });
  const conf = join(o.dir, 'nginx.conf');
  writeFileSync(conf, nginxConfig(o));
  const base = ['-p', o.dir, '-e', join(o.dir, 'error.log'), '-c', conf];
  const check = spawnSync(bin, [...base, '-t'], { encoding: 'utf8' });
  if (check.status !== 0) throw new Error(`nginx -t:\n${check.stderr}\n${nginxConfig(o)}`);
  const child = spawn(bin, [...base, '-g', 'daemon off; master_process on;'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (out += d));
  const read = (f: string) => (existsSync(join(o.dir, f)) ? readFileSync(join(o.dir, f), 'utf8') : '');
  const nginx: Nginx = {
    child,
    output: () => out,
    errorLog: () => read('error.log'),
    accessLog: () => read('access.log'),
    stop: async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const done = new Promise<void>((r) => child.once('exit', () => r()));
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await done;
      clearTimeout(timer);
    },
  };
  const deadline = Date.now() + 10_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`nginx exited (${child.exitCode}):\n${out}\n${nginx.errorLog()}`);
    const up = await new Promise<boolean>((resolve) => {
      const s = connect(o.port, '127.0.0.1', () => {
        s.destroy();
        resolve(true);
      });
      s.on('error', () => resolve(false));
    });
    if (up) return nginx;
    if (Date.now() > deadline) {
      await nginx.stop();
      throw new Error(`nginx did not listen on ${o.port} within 10 s:\n${out}\n${nginx.errorLog()}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

// ---- the HTTPS client ----

export interface Reply {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
  /** The parsed JSON, or undefined. */
  body: unknown;
  /** A network error instead of an answer (status 0). */
  error?: string;
}

export interface RequestOptions {
  token?: string;
  body?: unknown;
  headers?: Record<string, string>;
  /** The client's source address (127.0.0.2...). */
  localAddress?: string;
  agent?: https.Agent;
  /** The Host header and TLS server name (a portal host name); localhost by default. */
  host?: string;
  timeoutMs?: number;
}

/** HTTPS to nginx on 127.0.0.1:port, trusting `ca`. Never throws: a network error is status 0. */
export function httpsRequest(
  port: number,
  ca: string,
  method: string,
  path: string,
  o: RequestOptions = {},
): Promise<Reply> {
  const headers: Record<string, string> = { ...o.headers };
  if (o.token) headers.authorization = `Bearer ${o.token}`;
  const payload = o.body === undefined ? undefined : JSON.stringify(o.body);
  if (payload !== undefined) {
    headers['content-type'] = 'application/json';
    headers['content-length'] = String(Buffer.byteLength(payload));
  }
  const host = o.host ?? 'localhost';
  headers.host = `${host}:${port}`;
  return new Promise<Reply>((resolve) => {
    const req = https.request(
      {
        host: '127.0.0.1',
        port,
        method,
        path,
        headers,
        ca,
        servername: host,
        localAddress: o.localAddress,
        agent: o.agent ?? false,
        timeout: o.timeoutMs ?? 30_000,
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => (text += d));
        res.on('end', () => {
          let body: unknown;
          try {
            body = text ? JSON.parse(text) : undefined;
          } catch {
            /* not JSON */
          }
          resolve({ status: res.statusCode ?? 0, headers: res.headers, text, body });
        });
        res.on('error', (err) => resolve({ status: 0, headers: {}, text, body: undefined, error: err.message }));
      },
    );
    req.on('timeout', () => req.destroy(new Error('timed out')));
    req.on('error', (err: NodeJS.ErrnoException) =>
      resolve({ status: 0, headers: {}, text: '', body: undefined, error: `${err.code ?? ''} ${err.message}` }),
    );
    req.end(payload);
  });
}
