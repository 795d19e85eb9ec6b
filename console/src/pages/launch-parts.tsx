/**
 * The parts of the launch form (launch.tsx): the node's offer, a radio
 * choice, the template and image steps, the HTTP ports field and what to do
 * after a refusal (the price step: launch-price.tsx).
 */
import type { ComponentChildren } from 'preact';
import type { Offer, Template } from '../../../src/sdk/index.js';
import { api, call } from '../api.js';
import { accessText, readyOn } from '../templates.js';
import { type Async, ErrorText, Link } from '../ui.js';
import { formatRam, type RentalType } from './offers.js';
import { gbText, type UserImage } from './images.js';

/** The node's offer for a rental type, reading every page of GET /search; undefined when it has no GPUs for it. */
export async function findOffer(node: string, rental: RentalType): Promise<Offer | undefined> {
  const limit = 100;
  for (let offset = 0; ; offset += limit) {
    const page = await call(api.GET('/search', { params: { query: { rental_type: rental, limit, offset } } }));
    const hit = page.find((o) => o.node === node);
    if (hit || page.length < limit) return hit;
  }
}

/**
 * The HTTP ports field: whole numbers separated by commas (or spaces), or
 * nothing. Only the form is checked here; the API judges the ports (1024 to
 * 65535, at most 5, each once, not the template's own web ports) and its
 * message is the one shown.
 */
export function parsePorts(raw: string): number[] | undefined {
  const parts = raw.split(/[\s,]+/).filter(Boolean);
  if (parts.length === 0) return undefined;
  const bad = parts.find((p) => !/^\d{1,6}$/.test(p));
  if (bad !== undefined)
    throw new Error(
      `HTTP ports: "${bad}" is not a port number. Give whole numbers separated by commas, e.g. 8000, 6006.`,
    );
  return parts.map(Number);
}

export function Choice<T extends string | number>(props: {
  name: string;
  value: T;
  selected: T;
  onSelect: (v: T) => void;
  disabled?: boolean;
  children: ComponentChildren;
}) {
  return (
    <label class="choice">
      <input
        type="radio"
        name={props.name}
        value={String(props.value)}
        checked={props.value === props.selected}
        disabled={props.disabled}
        onChange={() => props.onSelect(props.value)}
      />
      <span>{props.children}</span>
    </label>
  );
}

/**
 * Step 3 of the form: the catalogue's templates, those ready on the node to choose from, the others shown
 * but not offered (their images are not on this host).
 */
export function TemplateStep(props: {
  node: string;
  templates: Async<Template[]>;
  selected: number | undefined;
  onSelect: (vmid: number) => void;
}) {
  const { node, templates } = props;
  return (
    <fieldset class="launch-step">
      <legend>3. Template</legend>
      {templates.data === undefined ? (
        templates.error ? (
          <ErrorText error={templates.error} />
        ) : (
          <p class="muted" role="status">
            <span class="spinner" aria-hidden="true" /> Loading the templates…
          </p>
        )
      ) : (
        <>
          <div class="choices">
            {templates.data.map((t) => {
              const ready = readyOn(t, node);
              return (
                <Choice
                  key={t.template_vmid}
                  name="template_vmid"
                  value={t.template_vmid}
                  selected={props.selected ?? -1}
                  onSelect={props.onSelect}
                  disabled={!ready}
                >
                  <strong>{t.name}</strong>{' '}
                  <span class="cell-sub">
                    {t.description} · {t.os} · {accessText(t)}
                    {t.min_disk_gb > 50 ? ` · disk of ${t.min_disk_gb} GB at least` : ''}
                  </span>
                  {ready ? null : <span class="cell-sub launch-unavailable"> · not available on this node</span>}
                </Choice>
              );
            })}
          </div>
          {templates.data.some((t) => readyOn(t, node)) ? (
            <small class="muted">
              Greyed-out templates are not on {node}’s host; <Link href="/templates">see where each is ready</Link>.
            </small>
          ) : (
            <p class="warning" role="alert">
              No template is ready on {node} yet. <Link href="/offers">Pick another node</Link>.
            </p>
          )}
        </>
      )}
    </fieldset>
  );
}

/** Step 3 when launching one of your images (?image=ID): the image instead of a template. */
export function ImageStep({ image }: { image: Async<UserImage | undefined> }) {
  const i = image.data;
  return (
    <fieldset class="launch-step">
      <legend>3. Image</legend>
      {i ? (
        <p>
          <strong>{i.name}</strong>{' '}
          <span class="cell-sub">
            your image of VM {i.source_vmid} · {gbText(i.size_gb)} · a disk of {i.disk_gb} GB at least
          </span>
        </p>
      ) : image.error ? (
        <ErrorText error={image.error} />
      ) : (
        <p class="muted" role="status">
          <span class="spinner" aria-hidden="true" /> Loading the image…
        </p>
      )}
      {i && i.state !== 'ready' ? (
        <p class="warning" role="alert">
          This image is {i.state}: only a ready image can start a VM.
        </p>
      ) : null}
      <small class="muted">
        The node downloads the image; the VM starts from a copy of its disk. To launch a template instead,{' '}
        <Link href="/offers">pick the offer again</Link>.
      </small>
    </fieldset>
  );
}

export function FailureHint({ code, node }: { code: string | undefined; node: string }) {
  if (code === 'insufficient_balance') {
    return (
      <p class="warning" role="note">
        Your balance does not cover this launch. <Link href="/billing">See how to add credit</Link>, then launch again.
      </p>
    );
  }
  if (code === 'gpu_unavailable') {
    return (
      <p class="warning" role="note">
        Those GPUs are gone: someone else took them, or the node stopped taking VMs. Choose fewer GPUs if some are still
        free, or <Link href="/offers">pick another node</Link>.
      </p>
    );
  }
  if (code === 'template_unavailable') {
    return (
      <p class="warning" role="note">
        That template is not ready on {node} any more. Choose another one above, or{' '}
        <Link href="/templates">see where each template is ready</Link>.
      </p>
    );
  }
  return null;
}

/** The node the form launches on: where it is, its GPUs and its host. */
export function OfferSummary({ offer }: { offer: Offer }) {
  return (
    <div class="card">
      <dl class="props">
        <dt>Node</dt>
        <dd>
          <strong>{offer.node}</strong>
          {offer.cluster_name ? <span class="muted"> · {offer.cluster_name}</span> : null} · {offer.location}
        </dd>
        <dt>GPU</dt>
        <dd>
          {offer.gpu_type}, {formatRam(offer.gpu_ram_mb)} each
        </dd>
        <dt>Host</dt>
        <dd>
          {offer.cpu_cores} cores ({offer.cpu_model}), {offer.ram_gb} GB RAM
          {offer.pcie_gen ? `, PCIe ${offer.pcie_gen}` : ''}; CPU and RAM are shared out by GPU
        </dd>
      </dl>
    </div>
  );
}
