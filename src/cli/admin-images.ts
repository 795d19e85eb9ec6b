/**
 * `gpucloud admin images ...`: disk images in the image store. `push` is the resumable upload: the file's
 * SHA-256 computed here first (read as a stream), an upload started with it, the file sent in ranges of 32 MiB
 * (each read from the file as it is sent, never the whole file in memory), a range that broke off sent again
 * from where the API says the upload ends, then completed: the API checks the whole image and names it by its
 * SHA-256. The upload's id is printed first, so a push that stopped can go on with --resume.
 */
import { createHash } from 'node:crypto';
import { createReadStream, statSync } from 'node:fs';
import { basename } from 'node:path';
import { GpuCloudError, type Image, type ImageUpload } from '../sdk/index.js';
import { call, LIMIT_OPTS, page, printJson, str, type Command, type Ctx } from './command.js';
import { CliFailure, CliUsageError, table } from './output.js';
import { bytesText, Progress } from './progress.js';
import { catalogue, resolveTemplate, templateLabel, templateOf } from './templates.js';

/** The size of each range sent (GPUCLOUD_PUSH_RANGE_MB, 1 to 64, changes it: the tests use 1). */
const RANGE_MB = 32;
/** Ranges in a row that may fail before the push gives up (each after asking where the upload ends). */
const RETRIES = 5;

function rangeBytes(ctx: Ctx): number {
  const n = Number(ctx.env.GPUCLOUD_PUSH_RANGE_MB);
  return (Number.isInteger(n) && n >= 1 && n <= 64 ? n : RANGE_MB) * 1024 * 1024;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The file's SHA-256, read as a stream, with a progress line. */
async function sha256Of(ctx: Ctx, file: string, size: number): Promise<string> {
  const progress = new Progress(ctx, `Checksumming ${basename(file)}`, size);
  const hash = createHash('sha256');
  let done = 0;
  progress.update(0);
  for await (const chunk of createReadStream(file, { highWaterMark: 1 << 20 })) {
    hash.update(chunk as Buffer);
    done += (chunk as Buffer).length;
    progress.update(done);
  }
  progress.end();
  return hash.digest('hex');
}

/** Bytes [start, end) of the file as a stream read as it is sent; `sent` hears how far it got. */
function rangeOf(
  file: string,
  start: number,
  end: number,
  sent: (at: number) => void,
): () => ReadableStream<Uint8Array> {
  return () => {
    const rs = createReadStream(file, { start, end: end - 1, highWaterMark: 1 << 20 });
    const it = rs[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
    let at = start;
    return new ReadableStream<Uint8Array>({
      async pull(c) {
        const { value, done } = await it.next();
        if (done) return c.close();
        at += value.length;
        c.enqueue(value);
        sent(at);
      },
      cancel() {
        rs.destroy();
      },
    });
  };
}

/** Whether a range's failure is worth sending from where the upload ends: the network, the server, the offset. */
function retryable(err: unknown): boolean {
  if (err instanceof GpuCloudError) return err.status >= 500 || err.code === 'conflict' || err.status === 422;
  return err instanceof TypeError || (err as { name?: string })?.name === 'AbortError';
}

/** A failure in a line: the API's detail, or the network's. */
function why(err: unknown): string {
  if (err instanceof GpuCloudError) return err.detail;
  const cause = (err as { cause?: { code?: string; message?: string } }).cause;
  return cause?.code ?? cause?.message ?? (err as Error).message;
}

async function uploadOf(ctx: Ctx, id: string): Promise<ImageUpload> {
  return call(ctx.client().api.GET('/admin/images/uploads/{upload_id}', { params: { path: { upload_id: id } } }));
}

/** Sends the file from where the upload ends to its end; answers once the API holds every byte. */
async function sendRanges(ctx: Ctx, file: string, upload: ImageUpload): Promise<void> {
  const client = ctx.client();
  const size = upload.size_bytes;
  const range = rangeBytes(ctx);
  let offset = upload.received_bytes;
  const progress = new Progress(ctx, `Uploading ${basename(file)}`, size, offset);
  progress.update(offset);
  let failures = 0;
  try {
    while (offset < size) {
      const end = Math.min(offset + range, size);
      try {
        const u = await client.putImageUploadRange(
          upload.id,
          offset,
          rangeOf(file, offset, end, (at) => progress.update(Math.min(at, end))),
        );
        offset = u.received_bytes;
        failures = 0;
        progress.update(offset);
      } catch (err) {
        if (!retryable(err) || ++failures > RETRIES) throw err;
        await sleep(500 * 2 ** (failures - 1));
        const u = await uploadOf(ctx, upload.id);
        progress.note(
          `The range at byte ${offset} did not arrive whole (${why(err)}); going on from byte ${u.received_bytes}, the upload's end (retry ${failures} of ${RETRIES})`,
        );
        offset = u.received_bytes;
      }
    }
  } finally {
    progress.end();
  }
}

function resumeHint(file: string, id: string): string {
  return `The upload is kept for a day: go on with gpucloud admin images push ${file} --resume ${id}`;
}

async function describeImage(ctx: Ctx, image: Image): Promise<string> {
  const lines = [
    `Image ${image.sha256}`,
    `  ${image.format}, ${bytesText(image.size_bytes)} (${image.size_bytes} bytes), a disk of ${bytesText(image.virtual_size_bytes)}`,
  ];
  if (image.templates.length === 0)
    lines.push(
      `It is no template's image yet: gpucloud admin templates set VMID --image ${image.sha256} makes it one.`,
    );
  for (const vmid of image.templates) {
    const t = await templateOf(ctx, vmid).catch(() => undefined);
    lines.push(
      `It is the image of template ${templateLabel(vmid, t ? [t] : undefined)}: hosts download it at their next heartbeat (gpucloud admin nodes templates NODE shows how far).`,
    );
  }
  return lines.join('\n');
}

export const ADMIN_IMAGE_COMMANDS: Command[] = [
  {
    path: 'admin images push',
    args: '<FILE>',
    summary: "Upload a disk image (qcow2 or raw) to the image store, resumably; optionally as a template's (admin)",
    example: [
      'gpucloud admin images push cuda-12.4.qcow2 --template 105',
      'gpucloud admin images push cuda-12.4.qcow2 --resume 0b6f3c1e-...   # the upload id a stopped push printed',
    ],
    options: [
      ['--template <T>', 'The template (number or name) whose image it becomes once checked'],
      ['--resume <UPLOAD_ID>', 'Go on with an upload a stopped push started (it printed the id)'],
    ],
    async run(ctx) {
      const file = ctx.positionals[0]!;
      let size: number;
      try {
        const st = statSync(file);
        if (!st.isFile()) throw new CliFailure(`Error: ${file} is not a file`);
        size = st.size;
      } catch (err) {
        if (err instanceof CliFailure) throw err;
        throw new CliFailure(
          `Error: cannot read ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
        );
      }
      if (size === 0) throw new CliFailure(`Error: ${file} is empty`);
      const rawTemplate = str(ctx, 'template');
      const template =
        rawTemplate === undefined
          ? undefined
          : resolveTemplate(rawTemplate, /^\d+$/.test(rawTemplate.trim()) ? undefined : await catalogue(ctx));
      const resume = str(ctx, 'resume');
      const client = ctx.client();

      let upload: ImageUpload;
      if (resume !== undefined) {
        upload = await uploadOf(ctx, resume);
        if (upload.size_bytes !== size)
          throw new CliFailure(
            `Error: upload ${resume} is of ${upload.size_bytes} bytes and ${file} has ${size}: resume it with the file it was started with`,
          );
        if (template !== undefined && upload.template_vmid !== template)
          throw new CliUsageError(
            `upload ${resume} was started ${upload.template_vmid === null ? 'for no template' : `for template ${upload.template_vmid}`}; --template cannot change it`,
          );
        ctx.err(`Resuming upload ${upload.id} at byte ${upload.received_bytes} of ${upload.size_bytes}`);
      } else {
        // What would refuse the upload is asked first, not after reading a large file: an administrator's
        // credentials, the template.
        await call(client.api.GET('/admin/images', { params: { query: { limit: 1 } } }));
        if (template !== undefined && !(await templateOf(ctx, template)))
          throw new CliFailure(
            `Error: there is no template ${template}; add it first (gpucloud admin templates add ${template} ...)`,
          );
        const sha256 = await sha256Of(ctx, file, size);
        upload = await call(
          client.api.POST('/admin/images/uploads', {
            body: { size_bytes: size, sha256, ...(template !== undefined ? { template_vmid: template } : {}) },
          }),
        );
        ctx.err(`Upload ${upload.id} started (sha256 ${sha256}); if this push stops, resume it with:`);
        ctx.err(`  gpucloud admin images push ${file} --resume ${upload.id}`);
      }

      let image: Image;
      try {
        await sendRanges(ctx, file, upload);
        ctx.err('Checking the image (the API reads it whole: checksum, format, no backing file)...');
        image = await call(
          client.api.POST('/admin/images/uploads/{upload_id}/complete', { params: { path: { upload_id: upload.id } } }),
        );
      } catch (err) {
        // The API refused the image itself: the upload is gone, nothing to resume.
        if (err instanceof GpuCloudError && err.status === 422 && err.code === 'validation_error') throw err;
        if (err instanceof GpuCloudError && err.status === 404) throw err;
        const head =
          err instanceof GpuCloudError ? `Error: ${err.detail}` : `Error: the upload broke off (${why(err)})`;
        throw new CliFailure(`${head}\n${resumeHint(file, upload.id)}`);
      }
      if (ctx.json) return printJson(ctx, image);
      ctx.out(await describeImage(ctx, image));
    },
  },
  {
    path: 'admin images list',
    summary: 'The images in the image store, newest first (admin)',
    example: 'gpucloud admin images list',
    options: LIMIT_OPTS,
    async run(ctx) {
      const rows = await call(ctx.client().api.GET('/admin/images', { params: { query: page(ctx) } }));
      if (ctx.json) return printJson(ctx, rows);
      if (rows.length === 0)
        return ctx.out('No images; push one with: gpucloud admin images push FILE --template VMID');
      ctx.out(
        table(
          ['SHA256', 'FORMAT', 'SIZE', 'DISK', 'TEMPLATES', 'CREATED'],
          rows.map((i) => [
            i.sha256,
            i.format,
            bytesText(i.size_bytes),
            bytesText(i.virtual_size_bytes),
            i.templates.length ? i.templates.join(', ') : 'none',
            i.created_at,
          ]),
        ),
      );
    },
  },
  {
    path: 'admin images delete',
    args: '<SHA256>',
    summary: 'Delete an image no template uses (admin); hosts remove their copies once no VM stands on them',
    example: 'gpucloud admin images delete 3f5a0c...',
    async run(ctx) {
      const sha256 = ctx.positionals[0]!.trim().toLowerCase();
      if (!/^[0-9a-f]{64}$/.test(sha256))
        throw new CliUsageError(
          `SHA256 must be an image's 64 hex digits (see gpucloud admin images list), got "${ctx.positionals[0]}"`,
        );
      await call(ctx.client().api.DELETE('/admin/images/{sha256}', { params: { path: { sha256 } } }));
      if (ctx.json) return printJson(ctx, {});
      ctx.out(`Deleted image ${sha256}`);
    },
  },
];
