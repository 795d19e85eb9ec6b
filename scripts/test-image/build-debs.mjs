// The Debian packages scripts/test-image.mjs builds the guest from: resolved with apt-cache, fetched with
// `apt-get download` into a cache that later builds reuse offline, unpacked with dpkg-deb.
import { existsSync, mkdirSync, readdirSync, rmSync, statSync } from 'node:fs';
import { homedir } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { fail, log, run } from './build-process.mjs';

const KERNEL_META = 'linux-image-cloud-amd64';
export const BUSYBOX_PKG = 'busybox-static';
// The user's login shell the seed declares (cloud images have bash); statically linked.
export const BASH_PKG = 'bash-static';
export const DROPBEAR_PKG = 'dropbear-bin';
export const WEBSOCKETD_PKG = 'websocketd';
// The libraries of dropbear-bin and websocketd (bookworm); the build checks with ld.so that these cover them.
export const LIB_PKGS = ['libc6', 'libcrypt1', 'libtomcrypt1', 'libtommath1', 'libgmp10', 'zlib1g'];

export function cacheDir() {
  const dir =
    process.env.GPUCLOUD_TEST_IMAGE_CACHE ||
    join(process.env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'gpucloud-test-image');
  mkdirSync(dir, { recursive: true });
  return resolve(dir);
}

/** apt-cache show of the candidate versions: package -> { pkg, version, arch, depends } for those apt knows. */
async function aptShow(pkgs) {
  const r = await run('apt-cache', ['show', '--no-all-versions', ...pkgs], { allowFail: true });
  const found = new Map();
  for (const stanza of (r.stdout ?? '').split(/\n\s*\n/)) {
    const field = (name) => stanza.match(new RegExp(`^${name}: (.*)$`, 'm'))?.[1]?.trim();
    const pkg = field('Package');
    if (pkg && !found.has(pkg)) {
      found.set(pkg, { pkg, version: field('Version'), arch: field('Architecture'), depends: field('Depends') ?? '' });
    }
  }
  return found;
}

let aptUpdated = false;
async function aptUpdate(why) {
  if (aptUpdated) return false;
  aptUpdated = true;
  log(`${why}: running apt-get update`);
  const r = await run('apt-get', ['update'], { allowFail: true });
  if (r.status !== 0) {
    log(`apt-get update failed (exit ${r.status}${process.getuid?.() !== 0 ? '; it needs root' : ''})`);
    return false;
  }
  return true;
}

const debName = (p) => `${p.pkg}_${p.version.replace(/:/g, '%3a')}_${p.arch}.deb`;
function cachedDebs(cache, pkg) {
  return readdirSync(cache)
    .filter((f) => f.startsWith(`${pkg}_`) && f.endsWith('.deb'))
    .map((f) => join(cache, f))
    .sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs);
}

/** The concrete kernel package behind linux-image-cloud-amd64. */
export async function kernelPackage(cache) {
  let meta = (await aptShow([KERNEL_META])).get(KERNEL_META);
  if (!meta && (await aptUpdate(`apt does not know ${KERNEL_META}`)))
    meta = (await aptShow([KERNEL_META])).get(KERNEL_META);
  const dep = meta?.depends
    .split(',')
    .map((d) => d.trim().split(/\s/)[0])
    .find((d) => /^linux-image-.*-cloud-amd64$/.test(d));
  if (dep) return dep;
  // Offline: use the newest cached kernel.
  const cached = readdirSync(cache)
    .filter((f) => /^linux-image-[0-9].*-cloud-amd64_.*\.deb$/.test(f))
    .sort((a, b) => statSync(join(cache, b)).mtimeMs - statSync(join(cache, a)).mtimeMs);
  if (cached.length) return cached[0].split('_')[0];
  fail(`cannot resolve ${KERNEL_META} (is deb.debian.org in the apt sources?)`);
}

/** Paths of the .debs for pkgs: from the cache, else apt-get download into it. */
export async function fetchDebs(cache, pkgs) {
  let info = await aptShow(pkgs);
  if (
    pkgs.some((p) => !info.has(p)) &&
    (await aptUpdate(`apt does not know ${pkgs.filter((p) => !info.has(p)).join(' ')}`))
  ) {
    info = await aptShow(pkgs);
  }
  const result = new Map();
  const toFetch = [];
  for (const pkg of pkgs) {
    const p = info.get(pkg);
    if (p?.version && p.arch) {
      const want = join(cache, debName(p));
      if (existsSync(want)) result.set(pkg, want);
      else toFetch.push(p);
    } else {
      const cached = cachedDebs(cache, pkg);
      if (!cached.length) fail(`package ${pkg} is not in apt's lists nor in the cache ${cache}`);
      log(`apt has no candidate for ${pkg}; using the cached ${basename(cached[0])}`);
      result.set(pkg, cached[0]);
    }
  }
  if (toFetch.length) {
    const specs = toFetch.map((p) => `${p.pkg}=${p.version}`);
    log(`downloading ${toFetch.map((p) => debName(p)).join(' ')} (apt-get download into ${cache})`);
    let r = await run('apt-get', ['download', ...specs], { cwd: cache, allowFail: true });
    if (r.status !== 0 && (await aptUpdate('apt-get download failed'))) {
      info = await aptShow(toFetch.map((p) => p.pkg));
      const again = toFetch.map((p) => info.get(p.pkg) ?? p);
      toFetch.splice(0, toFetch.length, ...again);
      r = await run('apt-get', ['download', ...again.map((p) => `${p.pkg}=${p.version}`)], {
        cwd: cache,
        allowFail: true,
      });
    }
    if (r.status !== 0) {
      fail(
        `apt-get download ${specs.join(' ')} failed:\n${`${r.stderr}${r.stdout}`.trim().split('\n').slice(-10).join('\n')}`,
      );
    }
    for (const p of toFetch) {
      const file = join(cache, debName(p));
      if (!existsSync(file)) fail(`apt-get download did not produce ${file}`);
      // Drop older versions of the same package.
      for (const old of cachedDebs(cache, p.pkg)) if (old !== file) rmSync(old, { force: true });
      result.set(p.pkg, file);
    }
  }
  return result;
}

export async function extractDeb(deb, dir) {
  mkdirSync(dir, { recursive: true });
  try {
    await run('dpkg-deb', ['-x', deb, dir]);
  } catch (err) {
    // A damaged download must not poison every later build.
    rmSync(deb, { force: true });
    fail(`${err.message}\n${basename(deb)} looks damaged and was removed from the cache; run the build again`);
  }
}
