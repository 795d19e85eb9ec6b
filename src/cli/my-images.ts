/**
 * Your images (docs/images.md): `gpucloud vm snapshot` saves a stopped VM's disk as a private image (with --wait,
 * until it is ready or failed), `gpucloud images` lists them, `images show` and `images delete` read and delete
 * one. `vm create --image` (vms.ts) starts a VM from one, with `imageForCreate` here.
 */
import type { paths } from '../sdk/index.js';
import {
  call,
  confirmOrAbort,
  flag,
  int,
  LIMIT_OPTS,
  page,
  printJson,
  str,
  type Command,
  type Ctx,
} from './command.js';
import { CliFailure, CliUsageError, keyValues, money, table } from './output.js';
import { vmPath } from './vm-access.js';
import { templateLabel, templateOf } from './templates.js';

export type UserImage = paths['/images/{image_id}']['get']['responses'][200]['content']['application/json'];

/** How often --wait reads the image (GPUCLOUD_POLL_MS changes it, as for the VM waits). */
const POLL_MS = 2000;

function imagePath(id: string) {
  return { params: { path: { image_id: id.trim() } } };
}

async function imageOf(ctx: Ctx, id: string): Promise<UserImage> {
  return call(ctx.client().api.GET('/images/{image_id}', imagePath(id)));
}

/** `vm create --image ID`: the image (another user's, or an unknown id, is the API's 404). */
export const imageForCreate = imageOf;

/** 78.383 -> "78.4 GB"; a size not known yet (being made) is "-". */
function gbText(gb: number | null): string | null {
  if (gb === null) return null;
  return `${gb >= 10 ? gb.toFixed(1) : gb.toFixed(2)} GB`;
}

/** An image's storage rate (the API's, to the micro-unit) per hour. */
function rateText(v: number | null): string | null {
  return v === null ? null : `${money(v, 6)}/h`;
}

function launchHint(img: UserImage): string {
  return `Start a VM from it (with a disk of ${img.disk_gb} GB or more): gpucloud vm create --node NODE --gpu GPU --image ${img.id}`;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Reads the image until it is no longer `creating`, with a status line on stderr: on a terminal one line redrawn
 * with the time taken, elsewhere a line when it starts and one when its state changes.
 */
async function waitForImage(ctx: Ctx, img: UserImage, timeoutS: number): Promise<UserImage> {
  const n = Number(ctx.env.GPUCLOUD_POLL_MS);
  const interval = Number.isFinite(n) && n > 0 ? n : POLL_MS;
  const started = Date.now();
  const tty = !!process.stderr.isTTY;
  const frames = ['|', '/', '-', '\\'];
  let frame = 0;
  const line = () =>
    `${frames[frame++ % frames.length]} Image "${img.name}": ${img.state}, copying the disk of VM ${img.source_vmid} (${Math.round((Date.now() - started) / 1000)}s)`;
  const timer = tty ? setInterval(() => process.stderr.write(`\r\x1b[K${line()}`), 250) : undefined;
  if (!tty) ctx.err(`Image "${img.name}": ${img.state}, copying the disk of VM ${img.source_vmid}...`);
  try {
    while (img.state === 'creating') {
      if (Date.now() - started + interval > timeoutS * 1000)
        throw new CliFailure(
          `Image "${img.name}" is still being made after ${timeoutS}s; it goes on in the background: gpucloud images show ${img.id}`,
        );
      await sleep(interval);
      img = await imageOf(ctx, img.id);
    }
  } finally {
    if (timer) {
      clearInterval(timer);
      process.stderr.write('\r\x1b[K');
    }
  }
  if (!tty) ctx.err(`Image "${img.name}": ${img.state} after ${Math.round((Date.now() - started) / 1000)}s`);
  return img;
}

async function showImage(ctx: Ctx, img: UserImage): Promise<string> {
  const t = await templateOf(ctx, img.template_vmid).catch(() => undefined);
  return keyValues([
    ['ID', img.id],
    ['Name', img.name],
    ['State', img.state],
    ...(img.state === 'failed' ? [['Error', img.error] as [string, string | null]] : []),
    ['Size', img.size_bytes === null ? (img.state === 'creating' ? 'not known yet' : null) : `${gbText(img.size_gb)}`],
    ['Disk', `${img.disk_gb} GB (a VM from it needs --disk ${img.disk_gb} at least)`],
    ['Template', templateLabel(img.template_vmid, t ? [t] : undefined)],
    ['Source VM', img.source_vm_id ? `${img.source_vmid} (${img.source_vm_id})` : img.source_vmid],
    ['Hourly cost', rateText(img.hourly_cost)],
    ['Created', img.created_at],
    ['Ready', img.ready_at],
  ]);
}

export const IMAGE_COMMANDS: Command[] = [
  {
    path: 'vm snapshot',
    args: '<VM>',
    summary: 'Save a stopped VM as a private image (its storage is billed per GB-hour once ready)',
    example: [
      'gpucloud vm snapshot 1234 --name trained-model-v2 --wait',
      'gpucloud vm snapshot 1234 --name base --json',
    ],
    options: [
      ['--name <NAME>', "The image's name, 1 to 64 characters (required)"],
      ['--wait', 'Wait until the image is ready, showing how long it takes; an image that fails says why'],
      ['--timeout <S>', 'With --wait: give up waiting after S seconds (default 1800); the copy goes on'],
    ],
    async run(ctx) {
      const name = str(ctx, 'name');
      if (name === undefined || name === '') throw new CliUsageError('--name is required');
      const timeout = int(ctx, 'timeout', { def: 1800, min: 1 })!;
      let img = await call(
        ctx.client().api.POST('/vms/{vm_id}/snapshots', { ...vmPath(ctx.positionals[0]!), body: { name } }),
      );
      if (!flag(ctx, 'wait')) {
        if (ctx.json) return printJson(ctx, img);
        ctx.out(
          `Saving VM ${img.source_vmid} as image "${img.name}" (${img.id}): ${img.state}. The VM cannot start until it is done; see it with: gpucloud images show ${img.id}`,
        );
        return;
      }
      if (!ctx.json) ctx.out(`Saving VM ${img.source_vmid} as image "${img.name}" (${img.id})`);
      img = await waitForImage(ctx, img, timeout);
      if (ctx.json) printJson(ctx, img);
      if (img.state === 'failed')
        throw new CliFailure(`Image "${img.name}" failed: ${img.error ?? 'no reason was given'}`);
      if (ctx.json) return;
      ctx.out(
        `Image "${img.name}" is ready: ${gbText(img.size_gb) ?? '-'}, ${rateText(img.hourly_cost) ?? '-'} while you keep it`,
      );
      ctx.out(launchHint(img));
    },
  },
  {
    path: 'images',
    summary: 'Your images (saved VM disks), newest first, with their state, size and hourly cost',
    example: ['gpucloud images', 'gpucloud images --json'],
    options: LIMIT_OPTS,
    async run(ctx) {
      const rows = await call(ctx.client().api.GET('/images', { params: { query: page(ctx) } }));
      if (ctx.json) return printJson(ctx, rows);
      if (rows.length === 0)
        return ctx.out('No images; save a stopped VM as one with: gpucloud vm snapshot VM --name NAME');
      ctx.out(
        table(
          ['ID', 'NAME', 'STATE', 'SIZE', '$/H', 'SOURCE VM', 'CREATED'],
          rows.map((i) => [
            i.id,
            i.name,
            i.state,
            gbText(i.size_gb),
            i.hourly_cost === null ? null : money(i.hourly_cost, 6),
            i.source_vmid,
            i.created_at,
          ]),
        ),
      );
    },
  },
  {
    path: 'images show',
    args: '<ID>',
    summary: 'Show one of your images; a failed one with its error',
    example: 'gpucloud images show 0b7e5d4c-3a2f-4e1d-9c8b-7a6f5e4d3c2b',
    async run(ctx) {
      const img = await imageOf(ctx, ctx.positionals[0]!);
      if (ctx.json) return printJson(ctx, img);
      ctx.out(await showImage(ctx, img));
      if (img.state === 'ready') ctx.out(`\n${launchHint(img)}`);
    },
  },
  {
    path: 'images delete',
    args: '<ID>',
    summary: 'Delete one of your images (asks first unless --yes); its storage is billed up to now',
    example: 'gpucloud images delete 0b7e5d4c-3a2f-4e1d-9c8b-7a6f5e4d3c2b --yes',
    options: [['-y, --yes', 'Do not ask']],
    async run(ctx) {
      const id = ctx.positionals[0]!;
      let name: string | undefined;
      if (!flag(ctx, 'yes')) {
        const img = await imageOf(ctx, id);
        name = img.name;
        await confirmOrAbort(
          ctx,
          `Delete image "${img.name}"${img.size_gb !== null ? ` (${gbText(img.size_gb)})` : ''}? VMs started from it keep their disks.`,
        );
      }
      await call(ctx.client().api.DELETE('/images/{image_id}', imagePath(id)));
      if (ctx.json) return printJson(ctx, {});
      ctx.out(`Deleted image ${name !== undefined ? `"${name}"` : id.trim()}; its storage is no longer billed`);
    },
  },
];
