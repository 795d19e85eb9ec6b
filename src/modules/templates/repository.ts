/** The only SQL of the template catalogue, its images and what each host holds of it. */
import type { Queryable } from '../../db/db.js';
import type { Row } from '../../db/rows.js';

export type TemplateRow = Row<'templates'>;
export type NodeTemplateRow = Row<'node_templates'>;

/** A template with its image's facts (null without an image). */
export type CatalogueRow = TemplateRow & {
  image_format: Row<'images'>['format'] | null;
  image_size_bytes: number | null;
};

const CATALOGUE = `SELECT t.*, i.format AS image_format, i.size_bytes AS image_size_bytes
  FROM templates t LEFT JOIN images i ON i.sha256 = t.image_sha256`;

export async function listTemplates(q: Queryable): Promise<CatalogueRow[]> {
  return (await q.query<CatalogueRow>(`${CATALOGUE} ORDER BY t.template_vmid`)).rows;
}

/** One template; `lock` holds it against a delete until the transaction ends (a VM is being built from it). */
export async function getTemplate(q: Queryable, vmid: number, lock = false): Promise<CatalogueRow | undefined> {
  const sql = `${CATALOGUE} WHERE t.template_vmid = $1${lock ? ' FOR KEY SHARE OF t' : ''}`;
  return (await q.query<CatalogueRow>(sql, [vmid])).rows[0];
}

export async function templateByName(q: Queryable, name: string): Promise<TemplateRow | undefined> {
  return (await q.query<TemplateRow>('SELECT * FROM templates WHERE name = $1', [name])).rows[0];
}

export type TemplateFields = Omit<TemplateRow, 'template_vmid' | 'created_at' | 'updated_at'>;

export async function insertTemplate(
  q: Queryable,
  vmid: number,
  t: TemplateFields,
  now: Date,
): Promise<TemplateRow | undefined> {
  return (
    await q.query<TemplateRow>(
      `INSERT INTO templates (template_vmid, name, description, os, default_user, webui_port, jupyter_port,
         min_disk_gb, gpu_types, image_sha256, created_at, updated_at)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11)
       ON CONFLICT DO NOTHING RETURNING *`,
      [
        vmid,
        t.name,
        t.description,
        t.os,
        t.default_user,
        t.webui_port,
        t.jupyter_port,
        t.min_disk_gb,
        t.gpu_types,
        t.image_sha256,
        now,
      ],
    )
  ).rows[0];
}

/** Locks a template: `update` for a change (VMs may still be created from it meanwhile), `delete` for a delete. */
export async function lockTemplate(
  q: Queryable,
  vmid: number,
  mode: 'update' | 'delete' = 'update',
): Promise<TemplateRow | undefined> {
  const lock = mode === 'delete' ? 'FOR UPDATE' : 'FOR NO KEY UPDATE';
  return (await q.query<TemplateRow>(`SELECT * FROM templates WHERE template_vmid = $1 ${lock}`, [vmid])).rows[0];
}

export async function updateTemplate(q: Queryable, vmid: number, t: TemplateFields, now: Date): Promise<void> {
  await q.query(
    `UPDATE templates SET name = $2, description = $3, os = $4, default_user = $5, webui_port = $6,
       jupyter_port = $7, min_disk_gb = $8, gpu_types = $9, image_sha256 = $10, updated_at = $11
     WHERE template_vmid = $1`,
    [
      vmid,
      t.name,
      t.description,
      t.os,
      t.default_user,
      t.webui_port,
      t.jupyter_port,
      t.min_disk_gb,
      t.gpu_types,
      t.image_sha256,
      now,
    ],
  );
}

export async function deleteTemplate(q: Queryable, vmid: number): Promise<void> {
  await q.query('DELETE FROM templates WHERE template_vmid = $1', [vmid]);
}

/** How many customer images (being made or ready) were taken of VMs of a template: VMs from them need it. */
export async function imagesUsing(q: Queryable, vmid: number): Promise<number> {
  return (
    await q.query<{ n: number }>(
      "SELECT count(*)::int8 AS n FROM user_images WHERE template_vmid = $1 AND state IN ('creating', 'ready')",
      [vmid],
    )
  ).rows[0]!.n;
}

/** How many VMs that are not destroyed were built from a template. */
export async function vmsUsing(q: Queryable, vmid: number): Promise<number> {
  return (
    await q.query<{ n: number }>(
      "SELECT count(*)::int8 AS n FROM vms WHERE template_vmid = $1 AND status <> 'destroyed'",
      [vmid],
    )
  ).rows[0]!.n;
}

/** Whether the image store holds an image (its row). */
export async function imageExists(q: Queryable, sha256: string): Promise<boolean> {
  return (await q.query('SELECT 1 FROM images WHERE sha256 = $1', [sha256])).rows.length > 0;
}

// ---- what the hosts hold ----

/** Replaces what one node's agent reported (every template it holds or was asked to hold). */
export async function replaceNodeTemplates(
  q: Queryable,
  node: string,
  states: Omit<NodeTemplateRow, 'node' | 'updated_at'>[],
  now: Date,
): Promise<void> {
  await q.query('DELETE FROM node_templates WHERE node = $1', [node]);
  if (states.length === 0) return;
  await q.query(
    `INSERT INTO node_templates (node, template_vmid, state, source, sha256, bytes_done, size_bytes, reason, updated_at)
     SELECT $1, * , $9::timestamptz FROM unnest($2::int4[], $3::text[], $4::text[], $5::text[], $6::int8[],
       $7::int8[], $8::text[])`,
    [
      node,
      states.map((s) => s.template_vmid),
      states.map((s) => s.state),
      states.map((s) => s.source),
      states.map((s) => s.sha256),
      states.map((s) => s.bytes_done),
      states.map((s) => s.size_bytes),
      states.map((s) => s.reason),
      now,
    ],
  );
}

export async function nodeTemplates(q: Queryable, node: string): Promise<NodeTemplateRow[]> {
  return (await q.query<NodeTemplateRow>('SELECT * FROM node_templates WHERE node = $1 ORDER BY template_vmid', [node]))
    .rows;
}

/** Every (node, template) pair that is ready on a node with an agent. */
export async function readyOnAgentNodes(q: Queryable): Promise<{ node: string; template_vmid: number }[]> {
  return (
    await q.query<{ node: string; template_vmid: number }>(
      `SELECT nt.node, nt.template_vmid FROM node_templates nt JOIN nodes n ON n.node = nt.node
        WHERE nt.state = 'ready' AND n.agent_url IS NOT NULL`,
    )
  ).rows;
}

/**
 * When a template is ready on a node's host (docs/templates.md), for a node `n` and a template `t`: its
 * agent reported it ready, or, for a node without an agent (the simulator), it is for the node's GPU type.
 */
const READY = `(n.agent_url IS NULL AND (t.gpu_types IS NULL OR n.gpu_type = ANY (t.gpu_types))
   OR EXISTS (SELECT 1 FROM node_templates nt
               WHERE nt.node = n.node AND nt.template_vmid = t.template_vmid AND nt.state = 'ready'))`;

/** Whether a template is ready on a node's host. */
export async function readyOn(q: Queryable, node: string, vmid: number): Promise<boolean> {
  const r = await q.query(
    `SELECT 1 FROM nodes n JOIN templates t ON t.template_vmid = $2 WHERE n.node = $1 AND ${READY}`,
    [node, vmid],
  );
  return r.rows.length > 0;
}

/** Every (node, template) pair that is ready, as "node:template_vmid" (what offers are made of). */
export async function readyPairs(q: Queryable): Promise<Set<string>> {
  const r = await q.query<{ node: string; template_vmid: number }>(
    `SELECT n.node, t.template_vmid FROM nodes n JOIN templates t ON ${READY}`,
  );
  return new Set(r.rows.map((row) => `${row.node}:${row.template_vmid}`));
}
