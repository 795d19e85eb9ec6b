/**
 * Operator page: the template catalogue. Every template with its access,
 * smallest disk, GPU types, image and where it is ready; adding one, editing
 * one, and deleting one (the API refuses while a VM stands on it, and says
 * why). Images are pushed from the command line (see images.tsx).
 */
import { useState } from 'preact/hooks';
import type { paths, Template } from '../../../src/sdk/index.js';
import { api, call } from '../api.js';
import { accessText, forgetTemplates, useTemplates } from '../templates.js';
import {
  Empty,
  Field,
  Form,
  FormDialog,
  Link,
  Loaded,
  Page,
  RowButton,
  Select,
  Submit,
  Table,
  notify,
  parseIntField,
  useAsync,
} from '../ui.js';

type CreateBody = paths['/admin/templates']['post']['requestBody']['content']['application/json'];
type PatchBody = paths['/admin/templates/{template_vmid}']['patch']['requestBody']['content']['application/json'];
type GpuType = NonNullable<CreateBody['gpu_types']>[number];

const GPU_TYPES: GpuType[] = ['5090', '4090', 'pro6000'];

/** The form's fields, as typed. */
interface Draft {
  name: string;
  description: string;
  os: string;
  default_user: string;
  webui_port: string;
  jupyter_port: string;
  min_disk_gb: string;
  gpu_types: GpuType[];
  /** '' for none. */
  image_sha256: string;
}

const EMPTY: Draft & { template_vmid: string } = {
  template_vmid: '',
  name: '',
  description: '',
  os: 'Ubuntu 24.04',
  default_user: 'ubuntu',
  webui_port: '',
  jupyter_port: '',
  min_disk_gb: '50',
  gpu_types: [],
  image_sha256: '',
};

function draftOf(t: Template): Draft {
  return {
    name: t.name,
    description: t.description,
    os: t.os,
    default_user: t.default_user,
    webui_port: t.access.webui_port === null ? '' : String(t.access.webui_port),
    jupyter_port: t.access.jupyter_port === null ? '' : String(t.access.jupyter_port),
    min_disk_gb: String(t.min_disk_gb),
    gpu_types: (t.gpu_types ?? []) as GpuType[],
    image_sha256: t.image?.sha256 ?? '',
  };
}

/** A whole number from a field (blank: `blank`); a message naming the field otherwise. */
function intOf(v: string, label: string, blank: number | null): number | null {
  const n = parseIntField(v);
  if (n === undefined) return blank;
  if (Number.isNaN(n)) throw new Error(`${label} must be a whole number.`);
  return n;
}

/** Every field of the form, as the API takes them (the API judges the values). */
function fieldsOf(d: Draft): Required<PatchBody> {
  return {
    name: d.name.trim(),
    description: d.description.trim(),
    os: d.os.trim(),
    default_user: d.default_user.trim(),
    webui_port: intOf(d.webui_port, 'WebUI port', null),
    jupyter_port: intOf(d.jupyter_port, 'Jupyter port', null),
    min_disk_gb: intOf(d.min_disk_gb, 'Minimum disk', 50)!,
    gpu_types: d.gpu_types.length ? d.gpu_types : null,
    image_sha256: d.image_sha256 || null,
  };
}

type Dialog = { kind: 'edit' | 'delete'; template: Template } | undefined;

export function TemplatesAdmin(_props: Record<string, unknown>) {
  const templates = useTemplates(10_000);
  const images = useAsync(() => call(api.GET('/admin/images', { params: { query: { limit: 100 } } })), []);
  const [dialog, setDialog] = useState<Dialog>(undefined);
  const [draft, setDraft] = useState(EMPTY);
  const reload = async () => {
    forgetTemplates();
    await Promise.all([templates.reload(), images.reload()]);
  };
  const imageOptions = [
    { value: '', label: 'none (hosts are given it by hand)' },
    ...(images.data ?? []).map((i) => ({
      value: i.sha256,
      label: `${i.sha256.slice(0, 16)}… (${i.format}, ${(i.size_bytes / 1024 ** 2).toFixed(1)} MiB)`,
    })),
  ];

  return (
    <Page title="Template catalogue">
      <div aria-hidden={dialog ? 'true' : undefined}>
        <p class="muted">
          What customers launch VMs from. A template with an image is downloaded by the host agents of its GPU types; it
          can be rented on a node once its host holds it ready (each node’s state is on the{' '}
          <Link href="/admin/nodes">Nodes</Link> page). Images are pushed from the command line:{' '}
          <code>gpucloud admin images push FILE --template ID</code> (see <Link href="/admin/images">Images</Link>).
        </p>
        <Loaded value={templates}>
          {(list) =>
            list.length === 0 ? (
              <Empty>No template yet. Add one below.</Empty>
            ) : (
              <Table
                class="adm-templates"
                caption="Templates"
                captionClass="adm-sr"
                head={
                  <>
                    <th>Template</th>
                    <th>System</th>
                    <th>Access</th>
                    <th>Image</th>
                    <th>Hosts</th>
                    <th>
                      <span class="adm-sr">Actions</span>
                    </th>
                  </>
                }
              >
                {list.map((t) => (
                  <tr key={t.template_vmid} data-template={t.template_vmid}>
                    <td>
                      <strong>{t.template_vmid}</strong> {t.name}
                      <div class="muted adm-small">{t.description}</div>
                    </td>
                    <td>
                      {t.os}
                      <div class="muted adm-small">
                        <code>{t.default_user}</code> · disk of {t.min_disk_gb} GB at least
                      </div>
                    </td>
                    <td class="adm-small">{accessText(t, true)}</td>
                    <td class="adm-small">
                      {t.image ? (
                        <>
                          <code title={t.image.sha256}>{t.image.sha256.slice(0, 12)}</code> {t.image.format}
                        </>
                      ) : (
                        <span class="muted">none</span>
                      )}
                    </td>
                    <td class="adm-small">
                      {t.gpu_types ? `${t.gpu_types.join(', ')} only` : 'every GPU type'}
                      <div class="muted">
                        {t.ready_on.nodes.length
                          ? `ready on ${t.ready_on.nodes.length} node${t.ready_on.nodes.length === 1 ? '' : 's'}`
                          : 'ready on no node yet'}
                      </div>
                    </td>
                    <td>
                      <div class="actions adm-row-actions">
                        <RowButton
                          aria-label={`Edit template ${t.template_vmid}`}
                          onClick={() => setDialog({ kind: 'edit', template: t })}
                        >
                          Edit
                        </RowButton>
                        <RowButton
                          variant="danger"
                          aria-label={`Delete template ${t.template_vmid}`}
                          onClick={() => setDialog({ kind: 'delete', template: t })}
                        >
                          Delete
                        </RowButton>
                      </div>
                    </td>
                  </tr>
                ))}
              </Table>
            )
          }
        </Loaded>
        {dialog ? null : (
          <section class="card adm-register" aria-labelledby="add-template-title">
            <h2 id="add-template-title">Add a template</h2>
            <Form
              aria-label="Add a template"
              onSubmit={async () => {
                const vmid = parseIntField(draft.template_vmid);
                if (vmid === undefined || Number.isNaN(vmid)) throw new Error('Enter the template id, e.g. 105.');
                const body: CreateBody = { template_vmid: vmid, ...fieldsOf(draft) };
                const t = await call(api.POST('/admin/templates', { body }));
                notify(`Template ${t.template_vmid} (${t.name}) added.`);
                setDraft(EMPTY);
                await reload();
              }}
            >
              <div class="adm-grid3">
                <Field
                  label="Template id"
                  inputMode="numeric"
                  autoComplete="off"
                  placeholder="e.g. 105"
                  value={draft.template_vmid}
                  onInput={(e) => setDraft({ ...draft, template_vmid: (e.target as HTMLInputElement).value })}
                  hint="100 to 999999; VMs are created with it."
                />
              </div>
              <TemplateFields v={draft} set={(p) => setDraft({ ...draft, ...p })} images={imageOptions} />
              <div class="actions">
                <Submit>Add template</Submit>
              </div>
            </Form>
          </section>
        )}
      </div>

      {dialog?.kind === 'edit' ? (
        <EditTemplate
          template={dialog.template}
          images={imageOptions}
          onClose={() => setDialog(undefined)}
          onDone={reload}
        />
      ) : null}
      {dialog?.kind === 'delete' ? (
        <FormDialog
          title={`Delete template ${dialog.template.template_vmid} (${dialog.template.name})?`}
          submitLabel="Delete template"
          danger
          onClose={() => setDialog(undefined)}
          onSubmit={async () => {
            const vmid = dialog.template.template_vmid;
            await call(api.DELETE('/admin/templates/{template_vmid}', { params: { path: { template_vmid: vmid } } }));
            notify(`Template ${vmid} deleted.`);
            await reload();
          }}
        >
          <p>
            Customers can no longer launch it, and hosts remove its image once no VM on them stands on it. The API
            refuses while a VM built from it is not destroyed.
          </p>
        </FormDialog>
      ) : null}
    </Page>
  );
}

function TemplateFields(props: {
  v: Draft;
  set: (patch: Partial<Draft>) => void;
  images: { value: string; label: string }[];
}) {
  const { v, set } = props;
  const input = (k: keyof Draft) => (e: Event) => set({ [k]: (e.target as HTMLInputElement).value });
  return (
    <>
      <div class="adm-grid3">
        <Field
          label="Name"
          required
          autoComplete="off"
          value={v.name}
          onInput={input('name')}
          hint="e.g. cuda-12.4: lowercase letters, digits, . _ -"
        />
        <Field label="Operating system" required value={v.os} onInput={input('os')} />
        <Field
          label="Login user"
          required
          autoComplete="off"
          value={v.default_user}
          onInput={input('default_user')}
          hint="The user the image has, or cloud-init makes."
        />
        <Field
          label="WebUI port"
          inputMode="numeric"
          placeholder="none"
          value={v.webui_port}
          onInput={input('webui_port')}
          hint="The guest port; empty: no WebUI."
        />
        <Field
          label="Jupyter port"
          inputMode="numeric"
          placeholder="none"
          value={v.jupyter_port}
          onInput={input('jupyter_port')}
          hint="The guest port; empty: no Jupyter."
        />
        <Field
          label="Minimum disk (GB)"
          inputMode="numeric"
          value={v.min_disk_gb}
          onInput={input('min_disk_gb')}
          hint="At least 50."
        />
      </div>
      <Field label="Description" required value={v.description} onInput={input('description')} />
      <fieldset class="adm-gpu-types">
        <legend>Only on GPU types</legend>
        {GPU_TYPES.map((g) => (
          <label key={g} class="adm-check">
            <input
              type="checkbox"
              checked={v.gpu_types.includes(g)}
              onChange={(e) =>
                set({
                  gpu_types: (e.target as HTMLInputElement).checked
                    ? [...v.gpu_types, g]
                    : v.gpu_types.filter((x) => x !== g),
                })
              }
            />{' '}
            {g}
          </label>
        ))}
        <small class="hint">None checked: the nodes of every GPU type hold it.</small>
      </fieldset>
      <Select label="Image" value={v.image_sha256} onChange={(x) => set({ image_sha256: x })} options={props.images} />
    </>
  );
}

function EditTemplate(props: {
  template: Template;
  images: { value: string; label: string }[];
  onClose: () => void;
  onDone: () => Promise<void>;
}) {
  const t = props.template;
  const initial = draftOf(t);
  const [v, setV] = useState(initial);
  // Its image is offered even when it is not among the images listed.
  const images =
    !initial.image_sha256 || props.images.some((o) => o.value === initial.image_sha256)
      ? props.images
      : [...props.images, { value: initial.image_sha256, label: `${initial.image_sha256.slice(0, 16)}…` }];
  return (
    <FormDialog
      title={`Edit template ${t.template_vmid}`}
      submitLabel="Save template"
      onClose={props.onClose}
      onSubmit={async () => {
        const before = fieldsOf(initial);
        const after = fieldsOf(v);
        const body: PatchBody = {};
        for (const k of Object.keys(after) as (keyof PatchBody)[])
          if (JSON.stringify(after[k]) !== JSON.stringify(before[k])) (body as Record<string, unknown>)[k] = after[k];
        if (Object.keys(body).length === 0) {
          notify('Nothing changed.', 'info');
          return;
        }
        await call(
          api.PATCH('/admin/templates/{template_vmid}', { params: { path: { template_vmid: t.template_vmid } }, body }),
        );
        notify(`Template ${t.template_vmid} saved.`);
        await props.onDone();
      }}
    >
      <TemplateFields v={v} set={(p) => setV({ ...v, ...p })} images={images} />
    </FormDialog>
  );
}
