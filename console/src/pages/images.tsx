/**
 * Your images (docs/images.md): stopped VMs' disks saved as private images, with their state, size, storage
 * cost and source VM; Launch (a ready one: pick an offer, then the launch form starts from the image) and
 * Delete (after confirming). A VM's page saves one (SaveImage, "Save as image").
 */
import { useState } from 'preact/hooks';
import type { paths, Vm } from '../../../src/sdk/index.js';
import { api, call, callWithTotal } from '../api.js';
import { navigate } from '../router.js';
import {
  Confirm,
  Field,
  FormDialog,
  Link,
  Money,
  Page,
  PagedTable,
  RowButton,
  Status,
  formatTime,
  usePaged,
} from '../ui.js';

export type UserImage = paths['/images/{image_id}']['get']['responses'][200]['content']['application/json'];

const PAGE = 50;

/** 78.383 -> "78.4 GB"; null (still being made) -> "—". */
export function gbText(gb: number | null): string {
  return gb === null ? '—' : `${gb >= 10 ? gb.toFixed(1) : gb.toFixed(2)} GB`;
}

export function MyImages(_props: Record<string, unknown>) {
  const [deleting, setDeleting] = useState<UserImage | undefined>(undefined);
  // Read again every 5 s: an image being made becomes ready (or failed) in the background.
  const images = usePaged((page) => callWithTotal(api.GET('/images', { params: { query: page } })), {
    limit: PAGE,
    pollMs: 5_000,
  });
  return (
    <Page title="My images">
      <p class="muted">
        An image is a stopped VM’s disk saved to start new VMs from, on any node (<em>Save as image</em> on the VM’s
        page). Its storage is billed per GB-hour while you keep it.
      </p>
      <PagedTable
        list={images}
        noun="images"
        empty={
          <>
            You have no images. Stop a VM and choose <em>Save as image</em> on <Link href="/vms">its page</Link>.
          </>
        }
        head={
          <>
            <th scope="col">Image</th>
            <th scope="col">State</th>
            <th scope="col" class="num">
              Size
            </th>
            <th scope="col" class="num">
              Cost
            </th>
            <th scope="col">Source VM</th>
            <th scope="col">Created</th>
            <th scope="col" aria-label="Actions" />
          </>
        }
        row={(i) => (
          <tr key={i.id} data-image={i.id}>
            <td>
              <strong title={`ID ${i.id}`}>{i.name}</strong>
              <span class="cell-sub">disk of {i.disk_gb} GB</span>
            </td>
            <td>
              <Status status={i.state} />
              {i.error ? <span class="cell-sub">{i.error}</span> : null}
            </td>
            <td class="num">{gbText(i.size_gb)}</td>
            <td class="num">{i.hourly_cost === null ? '—' : <Money value={i.hourly_cost} precise perHour />}</td>
            <td>
              {i.source_vm_id ? <Link href={`/vms/${i.source_vm_id}`}>VM {i.source_vmid}</Link> : `VM ${i.source_vmid}`}
            </td>
            <td>{formatTime(i.created_at)}</td>
            <td>
              <div class="actions adm-row-actions">
                {i.state === 'ready' ? (
                  <RowButton
                    variant="primary"
                    aria-label={`Launch ${i.name}`}
                    onClick={() => navigate(`/offers?image=${encodeURIComponent(i.id)}`)}
                  >
                    Launch
                  </RowButton>
                ) : null}
                {i.state !== 'creating' ? (
                  <RowButton variant="danger" aria-label={`Delete ${i.name}`} onClick={() => setDeleting(i)}>
                    Delete
                  </RowButton>
                ) : null}
              </div>
            </td>
          </tr>
        )}
      />
      {deleting ? (
        <Confirm
          title="Delete this image?"
          confirmLabel="Delete image"
          danger
          onConfirm={async () => {
            await call(api.DELETE('/images/{image_id}', { params: { path: { image_id: deleting.id } } }));
            await images.reload();
          }}
          onClose={() => setDeleting(undefined)}
        >
          <p>
            <strong>{deleting.name}</strong> ({gbText(deleting.size_gb)}) is deleted for good; its storage is billed up
            to now. VMs started from it keep their disks.
          </p>
        </Confirm>
      ) : null}
    </Page>
  );
}

/** The dialog of "Save as image" on a stopped VM's page: asks the name and saves the VM's disk. */
export function SaveImageDialog(props: { vm: Vm; onSaved: (img: UserImage) => void; onClose: () => void }) {
  const { vm } = props;
  const [name, setName] = useState('');
  return (
    <FormDialog
      title="Save as image"
      submitLabel="Save image"
      onSubmit={async () => {
        props.onSaved(
          await call(
            api.POST('/vms/{vm_id}/snapshots', { params: { path: { vm_id: vm.id } }, body: { name: name.trim() } }),
          ),
        );
      }}
      onClose={props.onClose}
    >
      <Field
        label="Image name"
        value={name}
        maxLength={64}
        placeholder="e.g. trained-model-v2"
        onInput={(e) => setName(e.currentTarget.value)}
        hint={`A copy of its ${vm.storage_gb} GB disk, to start new VMs from; the VM cannot start until it is made. Billed per GB-hour while you keep it.`}
      />
    </FormDialog>
  );
}

/** What the VM's page says once an image of it is being made. */
export function ImageSaved({ image }: { image: UserImage }) {
  return (
    <p class="card image-saved" role="status">
      Saving VM {image.source_vmid} as image “{image.name}”: it is ready in a few minutes.{' '}
      <Link href="/images">See it in My images</Link>
    </p>
  );
}
