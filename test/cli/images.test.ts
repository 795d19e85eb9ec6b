/**
 * Disk images from the command line, run as child processes against a real
 * listening server on both databases: `admin images push` (checksummed, sent
 * in ranges, checked by the API, made a template's image; a file that is not
 * an image is refused with the API's reason; a range cut off on the way is
 * sent again from where the upload ends; `--resume` finishes an upload
 * started elsewhere), `admin images list` and `delete`.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net, { type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describeEachDb } from '../helpers/app.js';
import { api } from '../helpers/api.js';
import { createApiKey, createUser, credit, type TestUser } from '../helpers/factories.js';
import { cliEnv, fails, gpucloud, ok, show } from './harness.js';

const MiB = 1024 * 1024;
const dir = mkdtempSync(join(tmpdir(), 'gpucloud-cli-images-'));
after(() => rmSync(dir, { recursive: true, force: true }));

let seq = 0;
/** A small real qcow2 image with random content. */
function qcow2(mb: number): string {
  const raw = join(dir, `img-${++seq}.raw`);
  writeFileSync(raw, randomBytes(mb * MiB));
  const out = join(dir, `img-${seq}.qcow2`);
  execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'qcow2', raw, out]);
  return out;
}
const sha256 = (file: string) => createHash('sha256').update(readFileSync(file)).digest('hex');

/**
 * A TCP proxy to the server that, once armed, cuts the connection carrying the byte past `cutAfter` (counted
 * from the arming, over every connection): a range broken off on the way.
 */
async function cuttingProxy(port: number) {
  let armed: number | null = null;
  let cuts = 0;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const up = net.connect(port, '127.0.0.1');
    for (const s of [client, up]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
    }
    client.on('data', (d: Buffer) => {
      if (armed !== null) {
        armed -= d.length;
        if (armed < 0) {
          armed = null;
          cuts++;
          client.destroy();
          up.destroy();
          return;
        }
      }
      up.write(d);
    });
    up.on('data', (d: Buffer) => client.write(d));
    client.on('close', () => up.destroy());
    up.on('close', () => client.destroy());
    client.on('error', () => up.destroy());
    up.on('error', () => client.destroy());
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    arm: (bytes: number) => (armed = bytes),
    cuts: () => cuts,
    close: () => {
      for (const s of sockets) s.destroy();
      return new Promise<void>((r) => server.close(() => r()));
    },
  };
}

describeEachDb('gpucloud admin images', (t) => {
  let base: string;
  let admin: TestUser;
  let renter: TestUser;
  let adminKey: string;
  let renterKey: string;
  let home: string;

  before(async () => {
    base = await t().app.listen({ port: 0, host: '127.0.0.1' });
    admin = await createUser(t(), { admin: true });
    renter = await createUser(t());
    await credit(t(), admin.token, renter.id, 500);
    adminKey = await createApiKey(t(), admin.token, 'read_write', 'cli-admin');
    renterKey = await createApiKey(t(), renter.token, 'read_write', 'cli');
    home = mkdtempSync(join(dir, 'home-'));
  });

  /** Runs `gpucloud ARGS` as the admin (or with `key`; null: no credentials at all). */
  const cli = (args: string[], opts: { key?: string | null; url?: string; env?: NodeJS.ProcessEnv } = {}) =>
    gpucloud(args, cliEnv(home, opts.url ?? base, opts.key === undefined ? adminKey : opts.key, opts.env));
  const asAdmin = () => api(t(), admin.token);
  const template = async (vmid: number) =>
    asAdmin().get('/templates/{template_vmid}', { params: { template_vmid: vmid } });
  const pushEnv = { GPUCLOUD_PUSH_RANGE_MB: '1' };

  test('admin images push: checksummed, sent in ranges, checked; the template gets the image; list and delete', async () => {
    const add = await asAdmin().post('/admin/templates', {
      body: {
        template_vmid: 160,
        name: 'pushed',
        description: 'pushed by the CLI',
        os: 'Debian 12',
        default_user: 'debian',
      },
    });
    assert.equal(add.status, 201, add.text);
    const file = qcow2(3);
    const r = await cli(['admin', 'images', 'push', file, '--template', 'pushed'], { env: pushEnv });
    ok(r);
    const sha = sha256(file);
    const id = /^Upload ([0-9a-f-]{36}) started \(sha256 ([0-9a-f]{64})\)/m.exec(r.stderr);
    assert.ok(id, show(r));
    assert.equal(id[2], sha, 'the checksum computed here');
    assert.ok(r.stderr.includes(`gpucloud admin images push ${file} --resume ${id[1]}`), 'how to resume');
    assert.match(r.stderr, /^Checksumming img-\d+\.qcow2: 100% /m);
    assert.match(r.stderr, /^Uploading img-\d+\.qcow2: 100% \(.* MB\/s\)$/m);
    assert.ok((r.stderr.match(/^Uploading /gm) ?? []).length >= 4, 'progress as the ranges go');
    assert.match(r.stdout, new RegExp(`^Image ${sha}\\n {2}qcow2, `));
    assert.match(r.stdout, /It is the image of template 160 \(pushed\): hosts download it/);
    const tpl = await template(160);
    assert.equal(tpl.status, 200, tpl.text);
    assert.equal(tpl.body.image?.sha256, sha);
    assert.equal(tpl.body.image?.format, 'qcow2');
    assert.equal(tpl.body.image?.size_bytes, readFileSync(file).length);

    const list = await cli(['admin', 'images', 'list']);
    ok(list);
    assert.match(list.stdout, new RegExp(`^${sha} +qcow2 +\\S+ MiB +\\S+ MiB +160 `, 'm'));
    const listJson = await cli(['admin', 'images', 'list', '--json']);
    ok(listJson);
    const images = await asAdmin().get('/admin/images');
    assert.deepEqual(JSON.parse(listJson.stdout), images.body);

    // The same image again, as JSON: stored once, the API's record on stdout.
    const again = await cli(['admin', 'images', 'push', file, '--json'], { env: pushEnv });
    ok(again);
    assert.equal(JSON.parse(again.stdout).sha256, sha);

    fails(await cli(['admin', 'images', 'delete', sha]), 1, /^Error: The image is template 160's/);
    ok(await cli(['admin', 'templates', 'set', '160', '--image', 'none']));
    const del = await cli(['admin', 'images', 'delete', sha]);
    ok(del);
    assert.equal(del.stdout, `Deleted image ${sha}\n`);
    assert.match((await cli(['admin', 'images', 'list'])).stdout, /^No images/);
    fails(await cli(['admin', 'images', 'delete', 'abc']), 2, /SHA256 must be an image's 64 hex digits/);
    fails(await cli(['admin', 'images', 'delete', sha]), 1, /^Error: Image not found/);
  });

  test('admin images push of what is not an image: the API’s reason, exit 1, nothing kept', async () => {
    const vmdk = join(dir, 'disk.vmdk');
    execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', vmdk, '1M']);
    const r = await cli(['admin', 'images', 'push', vmdk], { env: pushEnv });
    fails(r, 1, /^Error: the image is vmdk; an image must be qcow2 or raw; nothing was kept, upload it again$/m);
    assert.equal(r.stdout, '');
    const backed = join(dir, 'backed.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', '-u', '-b', '/etc/shadow', '-F', 'raw', backed, '1M']);
    fails(await cli(['admin', 'images', 'push', backed]), 1, /^Error: the image has a backing file/m);
    const images = await asAdmin().get('/admin/images');
    assert.deepEqual(images.body, [], 'no image was stored');

    fails(
      await cli(['admin', 'images', 'push', join(dir, 'missing.qcow2')]),
      1,
      /^Error: cannot read .*missing\.qcow2: ENOENT/,
    );
    fails(await cli(['admin', 'images', 'push', dir]), 1, /is not a file/);
    const empty = join(dir, 'empty.img');
    writeFileSync(empty, '');
    fails(await cli(['admin', 'images', 'push', empty]), 1, /is empty/);
    fails(
      await cli(['admin', 'images', 'push', vmdk, '--template', 'no-such']),
      2,
      /there is no template named "no-such"/,
    );
    fails(
      await cli(['admin', 'images', 'push', vmdk, '--template', '998']),
      1,
      /^Error: there is no template 998; add it first/,
    );
    const notAdmin = await cli(['admin', 'images', 'push', vmdk], { key: renterKey });
    fails(notAdmin, 1, /^Error: Administrator role required$/m);
    assert.doesNotMatch(notAdmin.stderr, /Checksumming/, 'refused before the file is read');
  });

  test('a push whose range is cut off on the way goes on from where the upload ends', async () => {
    const proxy = await cuttingProxy(Number(new URL(base).port));
    try {
      const file = qcow2(4);
      proxy.arm(MiB + MiB / 2); // mid-way through the second range
      const r = await cli(['admin', 'images', 'push', file], { url: proxy.url, env: pushEnv });
      ok(r);
      assert.equal(proxy.cuts(), 1, 'the proxy cut a connection');
      assert.match(
        r.stderr,
        /^The range at byte \d+ did not arrive whole \(.+\); going on from byte \d+, the upload's end \(retry 1 of 5\)$/m,
      );
      assert.match(r.stdout, new RegExp(`^Image ${sha256(file)}$`, 'm'));
      const images = await asAdmin().get('/admin/images');
      assert.equal(images.status, 200, images.text);
      assert.ok(images.body.some((i) => i.sha256 === sha256(file) && i.size_bytes === readFileSync(file).length));
    } finally {
      await proxy.close();
    }
  });

  test('--resume finishes an upload started elsewhere; a wrong file or id is refused', async () => {
    const add = await asAdmin().post('/admin/templates', {
      body: {
        template_vmid: 161,
        name: 'resumed',
        description: 'resumed by the CLI',
        os: 'Debian 12',
        default_user: 'debian',
      },
    });
    assert.equal(add.status, 201, add.text);
    const file = qcow2(3);
    const bytes = readFileSync(file);
    const auth = { authorization: `Bearer ${admin.token}` };
    const started = await fetch(`${base}/admin/images/uploads`, {
      method: 'POST',
      headers: { ...auth, 'content-type': 'application/json' },
      body: JSON.stringify({ size_bytes: bytes.length, sha256: sha256(file), template_vmid: 161 }),
    });
    assert.equal(started.status, 201, await started.clone().text());
    const upload = (await started.json()) as { id: string };
    const part = await fetch(`${base}/admin/images/uploads/${upload.id}?offset=0`, {
      method: 'PUT',
      headers: { ...auth, 'content-type': 'application/octet-stream' },
      body: bytes.subarray(0, MiB + 1000),
    });
    assert.equal(part.status, 200, await part.text());

    const other = qcow2(1);
    fails(
      await cli(['admin', 'images', 'push', other, '--resume', upload.id]),
      1,
      /is of \d+ bytes and .* has \d+: resume it with the file it was started with/,
    );
    fails(
      await cli(['admin', 'images', 'push', file, '--resume', upload.id, '--template', '150']),
      2,
      /was started for template 161; --template cannot change it/,
    );
    fails(
      await cli(['admin', 'images', 'push', file, '--resume', '00000000-0000-4000-8000-000000000000']),
      1,
      /^Error: Upload not found/,
    );

    const r = await cli(['admin', 'images', 'push', file, '--resume', upload.id], { env: pushEnv });
    ok(r);
    assert.match(r.stderr, new RegExp(`^Resuming upload ${upload.id} at byte ${MiB + 1000} of ${bytes.length}$`, 'm'));
    assert.doesNotMatch(r.stderr, /^Checksumming/m, 'the upload has its checksum already');
    assert.match(r.stdout, /It is the image of template 161 \(resumed\)/);
    const resumed = await template(161);
    assert.equal(resumed.status, 200, resumed.text);
    assert.equal(resumed.body.image?.sha256, sha256(file));
    // Completed: the upload is gone.
    fails(await cli(['admin', 'images', 'push', file, '--resume', upload.id]), 1, /^Error: Upload not found/);
  });
});
