/**
 * world(): the setup of a test in one line, made through the real API with the
 * factories of factories.ts, and typed handles on what was made:
 *
 *   const w = await world(t());                                  // a user, nothing else
 *   const w = await world(t(), { keys: true });                  // + w.keys.read_write / read_only / billing_only
 *   const w = await world(t(), { credit: 50, sshKey: true });    // + w.admin (who gave the credit), w.sshKeyId
 *   const w = await world(t(), { nodes: 2, vm: true });          // + w.nodes, w.node, w.vm (running), credit, key
 *
 * Only what was asked for is made (each thing costs requests): the user
 * always; the admin when asked for or needed (credit, nodes, a VM); one node
 * and 100 of credit and an SSH key when a VM is asked for and they were not
 * given. A handle exists in the type only when the options make it (w.vm is a
 * compile error without `vm`), so tests need no `!`.
 *
 * Every user comes with a typed client (helpers/api.ts): `w.user.api.get(...)`;
 * `w.as(token)` is one for any credential, e.g. `w.as(w.keys.read_only)`.
 */
import assert from 'node:assert/strict';
import type { TestApp } from './app.js';
import { createApiKey, createNode, createUser, credit, uploadSshKey, type TestUser } from './factories.js';
import { api, type Api, type BodyFor, type RequestBody } from './api.js';

export type Scope = 'read_write' | 'read_only' | 'billing_only';
export const SCOPES: readonly Scope[] = ['read_write', 'read_only', 'billing_only'];

/** A node as POST /admin/nodes answered it. */
export type NodeRecord = BodyFor<'/admin/nodes', 'post', 201>;
/** A VM as GET /vms/{vm_id} answers it. */
export type Vm = BodyFor<'/vms/{vm_id}', 'get', 200>;
/** Fields of POST /admin/nodes over createNode's defaults (4090 x 8, 512 GB RAM, 2000 GB disk). */
export type NodeSpec = Partial<RequestBody<'/admin/nodes', 'post'>>;
/** Fields of POST /vms over the world's defaults (the first node, its GPU type, 1 GPU, 50 GB, template 100). */
export type VmSpec = Partial<RequestBody<'/vms', 'post'>>;

export interface WorldOptions {
  /** An administrator, w.admin. Made anyway when credit, nodes or a VM need one. */
  admin?: boolean;
  /** Credit for the user, in the major unit (default 0; 100 with `vm`). */
  credit?: number;
  /** An SSH key for the user, w.sshKeyId (default: only with `vm`; false: none even then). */
  sshKey?: boolean;
  /** API keys of the user, named after their scope: true for one of each scope, or the scopes wanted. */
  keys?: boolean | readonly Scope[];
  /**
   * Nodes registered by the admin, w.nodes (w.node is the first): how many, or one spec each. Default 0; 1 with `vm`.
   */
  nodes?: number | readonly NodeSpec[];
  /**
   * A running VM of the user, w.vm: true, or fields of POST /vms. Moves no clock time (due work is settled with
   * advance(0)).
   */
  vm?: boolean | VmSpec;
}

export type WorldUser = TestUser & {
  /** A typed client with this user's session token. */
  api: Api;
};

// Which handles the options make, at the type level: only what is surely made is there.
type Opt<O, K extends keyof WorldOptions> = K extends keyof O ? O[K] : undefined;
type On<V> = V extends false | 0 | undefined | null ? false : true;
type Asked<O, K extends keyof WorldOptions> = On<Opt<O, K>> extends true ? true : false;
type Or<A, B> = A extends true ? true : B extends true ? true : false;
type HasVm<O> = Asked<O, 'vm'>;
type HasNodes<O> = Or<Asked<O, 'nodes'>, HasVm<O>>;
type HasAdmin<O> = Or<Asked<O, 'admin'>, Or<Asked<O, 'credit'>, HasNodes<O>>>;
type HasSshKey<O> = Opt<O, 'sshKey'> extends false ? false : Or<Asked<O, 'sshKey'>, HasVm<O>>;
type KeysOf<O> =
  Opt<O, 'keys'> extends true
    ? Record<Scope, string>
    : Opt<O, 'keys'> extends readonly (infer S extends Scope)[]
      ? { [K in S]: string }
      : {};

export type World<O extends WorldOptions = {}> = {
  t: TestApp;
  user: WorldUser;
  /** The user's API keys by scope (the key itself, a credential for `w.as`). */
  keys: KeysOf<O>;
  nodes: NodeRecord[];
  /** A typed client with this credential (a token, an API key or a user; none: anonymous). */
  as(who?: string | TestUser): Api;
  /** Another plain user (no credit, keys or SSH key): an outsider for ownership tests. */
  newUser(): Promise<WorldUser>;
} & (HasAdmin<O> extends true ? { admin: WorldUser } : {}) &
  (HasSshKey<O> extends true ? { sshKeyId: string } : {}) &
  (HasNodes<O> extends true ? { node: NodeRecord } : {}) &
  (HasVm<O> extends true ? { vm: Vm } : {});

/** Makes what `opts` asks for (see the top of this file) and returns typed handles on it. */
export async function world<const O extends WorldOptions = {}>(t: TestApp, opts?: O): Promise<World<O>> {
  const o: WorldOptions = opts ?? {};
  const vmSpec: VmSpec | undefined = o.vm === true ? {} : o.vm || undefined;
  const nodeSpecs: NodeSpec[] =
    typeof o.nodes === 'number' ? Array.from({ length: o.nodes }, () => ({})) : [...(o.nodes ?? [])];
  if (vmSpec && nodeSpecs.length === 0) nodeSpecs.push({});
  const creditAmount = o.credit ?? (vmSpec ? 100 : 0);
  const wantSshKey = o.sshKey ?? !!vmSpec;
  const wantAdmin = !!o.admin || creditAmount > 0 || nodeSpecs.length > 0 || !!vmSpec;
  const withApi = (u: TestUser): WorldUser => ({ ...u, api: api(t, u.token) });

  const [user, admin] = await Promise.all([
    createUser(t).then(withApi),
    wantAdmin ? createUser(t, { admin: true }).then(withApi) : undefined,
  ]);
  const w: Record<string, unknown> = {
    t,
    user,
    keys: {},
    nodes: [],
    as: (who?: string | TestUser) => api(t, typeof who === 'string' || who === undefined ? who : who.token),
    newUser: async () => withApi(await createUser(t)),
  };
  if (admin) w.admin = admin;

  if (creditAmount > 0) await credit(t, admin!.token, user.id, creditAmount);
  if (wantSshKey) w.sshKeyId = await uploadSshKey(t, user.token);
  const scopes = o.keys === true ? SCOPES : o.keys || [];
  const keys: Partial<Record<Scope, string>> = {};
  for (const scope of scopes) keys[scope] = await createApiKey(t, user.token, scope, scope);
  w.keys = keys;
  const nodes: NodeRecord[] = [];
  for (const spec of nodeSpecs) nodes.push(await createNode(t, admin!.token, spec));
  w.nodes = nodes;
  if (nodes[0]) w.node = nodes[0];

  if (vmSpec) {
    const made = await createVm(user.api, nodes[0]!, vmSpec);
    // The simulator provisions after GPUCLOUD_SIM_PROVISION_MS (0 in tests): settle that due work.
    await t.services.clock.advance(t.config.simProvisionMs / 1000);
    const vm = await user.api.get('/vms/{vm_id}', { params: { vm_id: made.id } });
    assert.equal(vm.status, 200, vm.text);
    assert.equal(vm.body.status, 'running', `world: the VM is ${vm.body.status}`);
    w.vm = vm.body;
  }
  return w as World<O>;
}

/**
 * POST /vms through `client` on `node` with the world's defaults (its GPU type, 1 GPU, 50 GB, template 100) under
 * `spec`; asserts the 201 and gives the VM it answered (still `creating`).
 */
export async function createVm(client: Api, node: NodeRecord, spec: VmSpec = {}) {
  const made = await client.post('/vms', {
    body: { node: node.node, gpu_type: node.gpu_type, gpu_count: 1, storage_gb: 50, template_vmid: 100, ...spec },
  });
  assert.equal(made.status, 201, made.text);
  return made.body;
}
