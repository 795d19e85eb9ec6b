/**
 * The launch form for one node's offer: rental type, GPU count, template
 * (from the catalogue: those ready on the node), access (SSH key or password,
 * HTTP ports to open through the access portal),
 * disk and label, top to bottom, with a price summary that follows
 * every choice (and the reservation quote from the API for reserved), then
 * `Launch`. The offer is re-read every 10 s, so the GPU counts offered are
 * the ones free now.
 */
import { useEffect, useRef, useState } from 'preact/hooks';
import type { CreateVmRequest, Offer } from '../../../src/sdk/index.js';
import { api, call, client, GpuCloudError, randomKey } from '../api.js';
import { navigate } from '../router.js';
import { forgetTemplates, readyOn, useTemplates } from '../templates.js';
import { Field, Form, Link, Loaded, Page, Submit, formatMoney, notify, useAsync, useDebounced } from '../ui.js';
import { Credentials, MIN_PASSWORD, type AuthMethod } from './launch-access.js';
import { Choice, FailureHint, findOffer, OfferSummary, parsePorts, ImageStep, TemplateStep } from './launch-parts.js';
import { DEFAULT_DISK_GB, RENTAL_LABELS, isRentalType, unitPrice, type RentalType } from './offers.js';
import { PriceStep } from './launch-price.js';

type GpuCount = CreateVmRequest['gpu_count'];
type Months = 1 | 3 | 6;

const GPU_COUNTS: GpuCount[] = [1, 2, 4, 8];
const MONTHS: Months[] = [1, 3, 6];
/** The API's smallest storage_gb. */
const MIN_DISK_GB = 50;
const LABEL_RE = /^[\x20-\x7e]{1,32}$/;
const POLL_MS = 10_000;
/** The template chosen first when the node holds it (the API's default). */
const DEFAULT_TEMPLATE = 101;

const RENTAL_ABOUT: Record<RentalType, string> = {
  on_demand: 'Pay by the hour; stop or destroy at any time.',
  interruptible:
    'Cheapest; stopped when an on-demand or reserved VM needs the GPUs, restarted when they are free again.',
  reserved: 'Prepaid for 1, 3 or 6 months at a discount; the GPUs stay yours while stopped.',
};

export function Launch({ node }: { node: string }) {
  const offers = useAsync(
    async () => {
      // On-demand and reserved may take GPUs held by interruptible VMs; interruptible only free ones.
      const [standard, interruptible] = await Promise.all([
        findOffer(node, 'on_demand'),
        findOffer(node, 'interruptible'),
      ]);
      return { standard, interruptible };
    },
    [node],
    POLL_MS,
  );
  // Once seen, the offer stays on screen if a later poll finds no GPUs (the form is not pulled away mid-way).
  const seen = useRef<Offer | undefined>(undefined);
  if (seen.current && seen.current.node !== node) seen.current = undefined;
  if (offers.data?.standard?.node === node) seen.current = offers.data.standard;

  return (
    <Page
      title={`Launch on ${node}`}
      actions={
        <Link href="/offers" class="btn btn-plain">
          Back
        </Link>
      }
    >
      <Loaded value={offers}>
        {(d) =>
          seen.current ? (
            <LaunchForm
              key={node}
              offer={seen.current}
              available={{
                on_demand: d.standard?.gpu_count ?? 0,
                reserved: d.standard?.gpu_count ?? 0,
                interruptible: d.interruptible?.gpu_count ?? 0,
              }}
              onGpusGone={() => void offers.reload()}
            />
          ) : (
            <div class="card">
              <p>
                The offer for node <strong>{node}</strong> is gone: the node has no GPUs free right now, or it is no
                longer offered.
              </p>
              <p>
                <Link href="/offers">Pick another one</Link> from the list.
              </p>
            </div>
          )
        }
      </Loaded>
    </Page>
  );
}

function LaunchForm({
  offer,
  available,
  onGpusGone,
}: {
  offer: Offer;
  available: Record<RentalType, number>;
  onGpusGone: () => void;
}) {
  const params = new URLSearchParams(location.search);
  const fromUrl = params.get('rental_type');
  const [rental, setRental] = useState<RentalType>(isRentalType(fromUrl) ? fromUrl : 'on_demand');
  const [months, setMonths] = useState<Months>(1);
  const [gpuCount, setGpuCount] = useState<GpuCount>(1);
  const templates = useTemplates(POLL_MS);
  const [template, setTemplate] = useState<number | undefined>(undefined);
  // ?image=ID (Launch on My images): the VM starts from that image instead of a template.
  const imageId = params.get('image');
  const image = useAsync(
    async () =>
      imageId ? call(api.GET('/images/{image_id}', { params: { path: { image_id: imageId } } })) : undefined,
    [imageId],
  );
  const img = image.data;
  const [auth, setAuth] = useState<AuthMethod>('ssh_key');
  const [keyId, setKeyId] = useState('');
  const [password, setPassword] = useState('');
  const [disk, setDisk] = useState(String(Math.min(DEFAULT_DISK_GB, Math.max(MIN_DISK_GB, offer.max_storage_gb))));
  const [label, setLabel] = useState('');
  const [ports, setPorts] = useState('');
  const [failure, setFailure] = useState<string | undefined>(undefined);
  const idem = useRef<{ key: string; body: string } | undefined>(undefined);

  const keys = useAsync(() => call(api.GET('/ssh-keys', { params: { query: { limit: 100 } } })), []);
  const balance = useAsync(() => call(api.GET('/billing/balance')), [], 30_000);

  // Without an SSH key the password is the way in; with keys, the newest is preselected.
  useEffect(() => {
    if (!keys.data) return;
    if (keys.data.length === 0) setAuth('password');
    else if (!keys.data.some((k) => k.id === keyId)) setKeyId(keys.data[0]!.id);
  }, [keys.data, keyId]);

  // The template: the one the link asked for, else the default, else the first the node holds; kept while ready.
  const ready = (templates.data ?? []).filter((t) => readyOn(t, offer.node));
  const chosen = ready.find((t) => t.template_vmid === template);
  useEffect(() => {
    if (!templates.data || chosen) return;
    const asked = Number(params.get('template'));
    const pick =
      ready.find((t) => t.template_vmid === asked) ?? ready.find((t) => t.template_vmid === DEFAULT_TEMPLATE);
    setTemplate((pick ?? ready[0])?.template_vmid);
  }, [templates.data, chosen]); // only these decide when it runs again
  // The template the VM gets: the chosen one, or the image's.
  const base = img ? templates.data?.find((t) => t.template_vmid === img.template_vmid) : chosen;
  // The disk starts at the template's (or the image's) minimum when that is more.
  const minDisk = Math.max(MIN_DISK_GB, (img ? img.disk_gb : chosen?.min_disk_gb) ?? MIN_DISK_GB);
  useEffect(() => {
    if (Number(disk) < minDisk && minDisk <= offer.max_storage_gb) setDisk(String(minDisk));
  }, [minDisk]);

  const free = available[rental];
  const counts = GPU_COUNTS.filter((n) => n <= free);
  // Keep the GPU count within what the rental type has free (the largest that fits).
  useEffect(() => {
    if (counts.length && !counts.includes(gpuCount)) setGpuCount(counts[counts.length - 1]!);
  }, [free, gpuCount]); // only these two decide when it runs again

  const diskGb = Number(disk);
  const diskOk = Number.isInteger(diskGb) && diskGb >= minDisk && diskGb <= offer.max_storage_gb;
  const discount =
    months === 6
      ? offer.reserved_discount_6mo
      : months === 3
        ? offer.reserved_discount_3mo
        : offer.reserved_discount_1mo;

  // The reservation quote, asked again when the shape changes (the disk once typing pauses).
  const quoteKey = useDebounced(
    JSON.stringify(rental === 'reserved' && diskOk ? [offer.gpu_type, gpuCount, diskGb, months] : null),
    300,
  );
  const quote = useAsync(async () => {
    const k = JSON.parse(quoteKey) as [Offer['gpu_type'], GpuCount, number, Months] | null;
    if (!k) return null;
    return call(
      api.POST('/reservations/calculate', {
        body: { gpu_type: k[0], gpu_count: k[1], storage_gb: k[2], reservation_months: k[3] },
      }),
    );
  }, [quoteKey]);

  const body = (): CreateVmRequest => {
    if (counts.length === 0)
      throw new Error(
        `Node ${offer.node} has no GPUs free for ${RENTAL_LABELS[rental].toLowerCase()} rental right now. Choose another rental type, or another offer.`,
      );
    if (imageId && !img) throw new Error(image.error ?? 'The image is still loading.');
    if (!img && !chosen) throw new Error(`Choose a template that is ready on ${offer.node}.`);
    if (!diskOk)
      throw new Error(
        `Disk size must be a whole number of GB from ${minDisk} to ${offer.max_storage_gb}${minDisk > MIN_DISK_GB ? ` (${img ? `image “${img.name}”` : chosen?.name} needs ${minDisk} GB at least)` : ''}.`,
      );
    if (auth === 'password' && password.length < MIN_PASSWORD)
      throw new Error(`The password needs at least ${MIN_PASSWORD} characters.`);
    if (auth === 'ssh_key' && !keyId) throw new Error('Choose an SSH key, or use a password.');
    const name = label.trim();
    if (name && !LABEL_RE.test(name)) throw new Error('The label must be 1 to 32 printable ASCII characters.');
    const httpPorts = parsePorts(ports);
    return {
      node: offer.node,
      gpu_type: offer.gpu_type,
      gpu_count: gpuCount,
      storage_gb: diskGb,
      ...(img ? { image_id: img.id } : { template_vmid: chosen!.template_vmid }),
      rental_type: rental,
      ...(rental === 'reserved' ? { reservation_months: months } : {}),
      auth_method: auth,
      ...(auth === 'ssh_key' ? { ssh_key_id: keyId } : { password }),
      ...(name ? { instance_label: name } : {}),
      ...(httpPorts ? { http_ports: httpPorts } : {}),
    };
  };

  const submit = async () => {
    setFailure(undefined);
    const b = body();
    // One key per request body: a retry after a lost answer finds the VM already made instead of making another.
    const json = JSON.stringify(b);
    if (!idem.current || idem.current.body !== json) idem.current = { key: randomKey(), body: json };
    try {
      const vm = await client.createVm(b, { idempotencyKey: idem.current.key });
      idem.current = undefined;
      notify(`VM ${vm.vmid} is being created on ${vm.node}.`);
      navigate(`/vms/${vm.id}`);
    } catch (e) {
      if (e instanceof GpuCloudError) {
        // The API answered: the next try (after adding credit, say) is a new request.
        idem.current = undefined;
        setFailure(e.code);
        if (e.code === 'gpu_unavailable') onGpusGone();
        if (e.code === 'template_unavailable') {
          forgetTemplates();
          void templates.reload();
        }
      }
      throw e;
    }
  };

  return (
    <>
      <OfferSummary offer={offer} />
      <Form class="card launch-form" onSubmit={submit}>
        <fieldset class="launch-step">
          <legend>1. Rental type</legend>
          <div class="choices">
            {(['on_demand', 'interruptible', 'reserved'] as RentalType[]).map((r) => (
              <Choice
                key={r}
                name="rental_type"
                value={r}
                selected={rental}
                onSelect={setRental}
                disabled={available[r] === 0 && r !== rental}
              >
                <strong>{RENTAL_LABELS[r]}</strong>{' '}
                <span class="cell-sub">
                  {formatMoney(unitPrice(offer, r), 'USD', true)}/h per GPU{r === 'reserved' ? ' before discount' : ''}{' '}
                  · {available[r]} free
                </span>
              </Choice>
            ))}
          </div>
          <small class="muted">{RENTAL_ABOUT[rental]}</small>
          {rental === 'reserved' ? (
            <fieldset class="launch-step">
              <legend>Reservation length</legend>
              <div class="choices">
                {MONTHS.map((m) => (
                  <Choice key={m} name="reservation_months" value={m} selected={months} onSelect={setMonths}>
                    {m} {m === 1 ? 'month' : 'months'}{' '}
                    <span class="cell-sub">
                      −
                      {m === 6
                        ? offer.reserved_discount_6mo
                        : m === 3
                          ? offer.reserved_discount_3mo
                          : offer.reserved_discount_1mo}
                      %
                    </span>
                  </Choice>
                ))}
              </div>
            </fieldset>
          ) : null}
        </fieldset>

        <fieldset class="launch-step">
          <legend>2. GPUs</legend>
          {counts.length ? (
            <div class="choices">
              {counts.map((n) => (
                <Choice key={n} name="gpu_count" value={n} selected={gpuCount} onSelect={setGpuCount}>
                  {n} {n === 1 ? 'GPU' : 'GPUs'}
                </Choice>
              ))}
            </div>
          ) : (
            <p class="warning" role="alert">
              No GPUs are free for {RENTAL_LABELS[rental].toLowerCase()} rental on {offer.node} right now. Choose
              another rental type, or <Link href="/offers">another offer</Link>.
            </p>
          )}
          <small class="muted">
            {free} {offer.gpu_type} {free === 1 ? 'GPU is' : 'GPUs are'} free for {RENTAL_LABELS[rental].toLowerCase()}{' '}
            rental; a VM takes 1, 2, 4 or 8.
          </small>
        </fieldset>

        {imageId ? (
          <ImageStep image={image} />
        ) : (
          <TemplateStep node={offer.node} templates={templates} selected={template} onSelect={setTemplate} />
        )}

        <fieldset class="launch-step">
          <legend>4. Access</legend>
          <Credentials
            keys={keys}
            auth={auth}
            setAuth={setAuth}
            keyId={keyId}
            setKeyId={setKeyId}
            password={password}
            setPassword={setPassword}
          />
          <Field
            label="HTTP ports (optional)"
            value={ports}
            onInput={(e) => setPorts(e.currentTarget.value)}
            placeholder="e.g. 8000, 6006"
            autoComplete="off"
            hint={
              <>
                Up to 5 ports (1024 to 65535) your own apps serve in the VM, separated by commas. Each opens in the
                browser from the VM’s page, through the access portal and behind a one-time sign-in.
                {base && (base.access.webui_port !== null || base.access.jupyter_port !== null)
                  ? ` ${base.name}’s own web services have links of their own.`
                  : ''}{' '}
                Fixed for the VM’s life.
              </>
            }
          />
        </fieldset>

        <fieldset class="launch-step">
          <legend>5. Disk and label</legend>
          <div class="grid2">
            <Field
              label="Disk size (GB)"
              type="number"
              min={minDisk}
              max={offer.max_storage_gb}
              step={1}
              inputMode="numeric"
              value={disk}
              onInput={(e) => setDisk(e.currentTarget.value)}
              aria-invalid={!diskOk || undefined}
              hint={`${minDisk} to ${offer.max_storage_gb} GB, at ${formatMoney(offer.storage_price_hourly, 'USD', true)} per GB-hour.`}
            />
            <Field
              label="Label (optional)"
              value={label}
              onInput={(e) => setLabel(e.currentTarget.value)}
              maxLength={32}
              placeholder="e.g. training-run-3"
              hint="Up to 32 characters, to tell your VMs apart."
            />
          </div>
        </fieldset>

        <PriceStep
          offer={offer}
          rental={rental}
          months={months}
          gpuCount={gpuCount}
          discount={discount}
          diskGb={diskGb}
          diskOk={diskOk}
          minDisk={minDisk}
          quote={quote}
          balance={balance}
        />

        <div class="actions">
          <Submit>Launch</Submit>
        </div>
      </Form>
      <FailureHint code={imageId && failure === 'template_unavailable' ? undefined : failure} node={offer.node} />
    </>
  );
}
