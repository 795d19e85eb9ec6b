/**
 * Operator page: the disk images in the image store, by SHA-256: their
 * format, size, the disk they hold and the templates they are the image of;
 * deleting one no template uses. Pushing an image is the command line's job
 * (a resumable upload of a file of many gigabytes), and the page says how.
 */
import { useState } from 'preact/hooks';
import type { Image } from '../../../src/sdk/index.js';
import { api, call, callWithTotal } from '../api.js';
import { CopyButton, FormDialog, Link, Page, PagedTable, RowButton, formatTime, notify, usePaged } from '../ui.js';

const PAGE = 50;

function mib(bytes: number): string {
  return bytes >= 1024 ** 3 ? `${(bytes / 1024 ** 3).toFixed(1)} GiB` : `${(bytes / 1024 ** 2).toFixed(1)} MiB`;
}

export function Images(_props: Record<string, unknown>) {
  const [deleting, setDeleting] = useState<Image | undefined>(undefined);
  const images = usePaged((page) => callWithTotal(api.GET('/admin/images', { params: { query: page } })), {
    limit: PAGE,
  });
  return (
    <Page title="Images">
      <div aria-hidden={deleting ? 'true' : undefined}>
        <section class="card adm-push" aria-labelledby="push-title">
          <h2 id="push-title">Pushing an image</h2>
          <p>
            Images are pushed from the command line, which checksums the file and sends it in ranges it can resume after
            a broken connection (and never holds it in memory):
          </p>
          <div class="secret">
            <code>gpucloud admin images push FILE --template ID</code>
            <CopyButton text="gpucloud admin images push FILE --template ID" label="Copy command" />
          </div>
          <p class="muted adm-small">
            qcow2 or raw, without a backing file; the API checks it whole before any host is given it. With{' '}
            <code>--template</code> it becomes that template’s image (see the{' '}
            <Link href="/admin/templates">template catalogue</Link>), and the hosts of its GPU types download it.
          </p>
        </section>
        <PagedTable
          list={images}
          noun="images"
          empty={images.offset > 0 ? 'Nothing on this page.' : 'No image in the store yet.'}
          class="adm-images"
          caption="Images"
          head={
            <>
              <th>SHA-256</th>
              <th>Format</th>
              <th class="num">Size</th>
              <th class="num">Disk</th>
              <th>Templates</th>
              <th>Pushed</th>
              <th>
                <span class="adm-sr">Actions</span>
              </th>
            </>
          }
          row={(i) => (
            <tr key={i.sha256} data-sha256={i.sha256}>
              <td>
                <code title={i.sha256}>{i.sha256.slice(0, 16)}…</code>{' '}
                <CopyButton text={i.sha256} label="Copy SHA-256" />
              </td>
              <td>{i.format}</td>
              <td class="num">{mib(i.size_bytes)}</td>
              <td class="num">{mib(i.virtual_size_bytes)}</td>
              <td>{i.templates.length ? i.templates.join(', ') : <span class="muted">none</span>}</td>
              <td>{formatTime(i.created_at)}</td>
              <td>
                <RowButton
                  variant="danger"
                  aria-label={`Delete image ${i.sha256.slice(0, 12)}`}
                  onClick={() => setDeleting(i)}
                >
                  Delete
                </RowButton>
              </td>
            </tr>
          )}
        />
      </div>
      {deleting ? (
        <FormDialog
          title={`Delete image ${deleting.sha256.slice(0, 12)}?`}
          submitLabel="Delete image"
          danger
          onClose={() => setDeleting(undefined)}
          onSubmit={async () => {
            await call(api.DELETE('/admin/images/{sha256}', { params: { path: { sha256: deleting.sha256 } } }));
            notify(`Image ${deleting.sha256.slice(0, 12)} deleted.`);
            await images.reload();
          }}
        >
          <p>
            It leaves the image store; hosts remove their copies once no VM on them stands on it. The API refuses while
            it is a template’s image.
          </p>
        </FormDialog>
      ) : null}
    </Page>
  );
}
