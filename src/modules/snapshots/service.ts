/**
 * Customer images (docs/images.md): a stopped VM's disk saved as a private image, listed, deleted,
 * and used to start new VMs. A snapshot is taken in the background: the VM's host flattens its disk
 * into one file, the control plane copies it into the image store (checking its SHA-256 and the
 * image) and the image is `ready`; from then on its storage is billed per GB-hour (meter.ts).
 * Another customer's image is 404, whatever it is asked.
 */
import type { Db, Queryable } from '../../db/db.js';
import type { ImageRecord } from './schemas.js';
import { realTimeMs, type Clock } from '../../clock.js';
import { AppError, invalidState, notFound, validation } from '../../errors.js';
import { newId, UUID_RE } from '../../ids.js';
import { storageCost, toAmount } from '../../money.js';
import { CONTROL_CHARS } from '../../http/schemas.js';
import type { DiskExport, VmRef } from '../../hypervisor/driver.js';
import * as ledger from '../billing/ledger.js';
import * as repo from './repository.js';
import type { UserImageRow } from './repository.js';
import type { ImageMeter } from './meter.js';

/** How long an instance holds a snapshot it is taking before another may take it over (real time). */
export const SNAPSHOT_LEASE_MS = 30 * 60 * 1000;
export const DEFAULT_MAX_IMAGES = 10;
export const DEFAULT_MAX_IMAGE_GB = 1000;
/** Names: 1 to 64 characters, none of them a control character. */
export const IMAGE_NAME_MAX = 64;
const CONTROL = new RegExp(`[${CONTROL_CHARS}]`);

/** The stopped VM a snapshot is taken of, as the VM module hands it over. */
export interface SnapshotSource {
  id: string;
  vmid: number;
  node: string;
  storage_gb: number;
  template_vmid: number;
  /** Its login user on its host, when the host said. */
  ssh_user: string | null;
}

export interface SnapshotDeps {
  db: Db;
  clock: Clock;
  meter: ImageMeter;
  /** The user's VM by id or vmid, locked, if it may be snapshotted (else 400 invalid_state / 404). */
  lockSource: (tx: Queryable, userId: number, ref: string) => Promise<SnapshotSource>;
  /** The VM as it is now, if it is still stopped where its disk is: what the export is asked of. */
  currentSource: (vmId: string) => Promise<VmRef | null>;
  driver: { exportDisk(vm: VmRef): Promise<DiskExport | null>; dropExport(vm: VmRef): Promise<void> };
  store: {
    importFrom(src: { url: string; token: string; sha256: string; sizeBytes: number }): Promise<number>;
    forgetUnused(sha256: string, inUse: (tx: Queryable) => Promise<boolean>): Promise<void>;
  };
  limits: { maxImages: number; maxImageGb: number };
  log?: { warn(obj: object, msg: string): void };
}

export class SnapshotService {
  constructor(private readonly deps: SnapshotDeps) {}

  private record(i: UserImageRow): ImageRecord {
    const price = this.deps.meter.priceGbHourMicros;
    return {
      id: i.id,
      name: i.name,
      state: i.state === 'deleted' ? 'failed' : i.state,
      size_bytes: i.size_bytes,
      size_gb: i.size_bytes === null ? null : Math.round((i.size_bytes / 1e9) * 1000) / 1000,
      disk_gb: i.disk_gb,
      template_vmid: i.template_vmid,
      source_vm_id: i.source_vm_id,
      source_vmid: i.source_vmid,
      hourly_cost: i.state === 'ready' && i.size_bytes !== null ? toAmount(storageCost(i.size_bytes, price)) : null,
      error: i.error,
      created_at: i.created_at.toISOString(),
      ready_at: i.ready_at?.toISOString() ?? null,
    };
  }

  /** `POST /vms/{vm_id}/snapshots`: a stopped VM's disk, to be copied into a private image (202: `creating`). */
  async take(userId: number, vmRef: string, name: string): Promise<ImageRecord> {
    if (name.length < 1 || name.length > IMAGE_NAME_MAX)
      throw validation('body.name', `must be 1 to ${IMAGE_NAME_MAX} characters`);
    if (CONTROL.test(name)) throw validation('body.name', 'must not contain control characters');
    if (name.trim() !== name || name.trim() === '') throw validation('body.name', 'must not start or end with spaces');
    return this.deps.db.transaction(async (tx) => {
      const vm = await this.deps.lockSource(tx, userId, vmRef);
      // The balance row serializes this user's snapshots: the limits are counted once.
      await ledger.lockBalance(tx, userId);
      const used = await repo.usageOf(tx, userId);
      const { maxImages, maxImageGb } = this.deps.limits;
      if (used.count + 1 > maxImages)
        throw new AppError(
          'limit_exceeded',
          `Image limit reached: at most ${maxImages} images per account (delete one first)`,
        );
      const worst = used.bytes + vm.storage_gb * 1e9;
      if (worst > maxImageGb * 1e9)
        throw new AppError(
          'limit_exceeded',
          `Image storage limit reached: your images hold up to ${Math.round(used.bytes / 1e9)} GB and this VM's disk is ${vm.storage_gb} GB; at most ${maxImageGb} GB per account (delete an image first)`,
        );
      const row = await repo.insertImage(tx, {
        id: newId(),
        user_id: userId,
        name,
        source_vm_id: vm.id,
        source_vmid: vm.vmid,
        source_node: vm.node,
        template_vmid: vm.template_vmid,
        login_user: vm.ssh_user,
        disk_gb: vm.storage_gb,
        created_at: this.deps.clock.now(),
      });
      return this.record(row);
    });
  }

  async list(userId: number, limit: number, offset: number): Promise<{ items: ImageRecord[]; total: number }> {
    const r = await repo.listImages(this.deps.db, userId, limit, offset);
    return { items: r.rows.map((i) => this.record(i)), total: r.total };
  }

  private async mine(q: Queryable, userId: number, id: string, lock = false): Promise<UserImageRow> {
    const row = UUID_RE.test(id) ? await repo.getImage(q, id, userId, lock) : undefined;
    if (!row || row.state === 'deleted') throw notFound('Image');
    return row;
  }

  async get(userId: number, id: string): Promise<ImageRecord> {
    return this.record(await this.mine(this.deps.db, userId, id));
  }

  /**
   * Deletes an image: its storage is billed up to now and no longer. Its content leaves the store
   * once no other image, template or VM being built stands on it. One being made cannot be deleted.
   */
  async delete(userId: number, id: string): Promise<{ message: string }> {
    const now = this.deps.clock.now();
    const row = await this.deps.db.transaction(async (tx) => {
      const img = await this.mine(tx, userId, id, true);
      if (img.state === 'creating')
        throw invalidState('The image is still being made; delete it once it is ready or failed');
      if (img.state === 'ready') await this.deps.meter.closeUpTo(tx, img, now.getTime(), true);
      return repo.updateImage(tx, img.id, {
        state: 'deleted',
        deleted_at: now,
        claim_token: null,
        claimed_until: null,
      });
    });
    if (row.sha256) {
      const sha = row.sha256;
      await this.deps.store
        .forgetUnused(sha, (tx) => repo.contentInUse(tx, sha))
        .catch((err: unknown) => {
          this.deps.log?.warn(
            { image: row.id, err: err instanceof Error ? err.message : String(err) },
            'image content not removed',
          );
        });
    }
    return { message: `Image "${row.name}" deleted; its storage is no longer billed` };
  }

  /**
   * What `POST /vms` with `image_id` builds from: the user's ready image (404 for another's or an
   * unknown one), whose disk fits in `storageGb` (422 otherwise).
   */
  async forCreate(
    tx: Queryable,
    userId: number,
    imageId: string,
    storageGb: number,
  ): Promise<{ id: string; template_vmid: number; sha256: string | null }> {
    const img = await this.mine(tx, userId, imageId);
    if (img.state !== 'ready')
      throw invalidState(`Image "${img.name}" is ${img.state}: only a ready image can start a VM`);
    if (storageGb < img.disk_gb)
      throw validation(
        'body.storage_gb',
        `image "${img.name}" holds a ${img.disk_gb} GB disk: storage_gb must be at least that`,
      );
    return { id: img.id, template_vmid: img.template_vmid, sha256: img.sha256 };
  }

  /** The content a VM is built from, and the login user the disk has, for the driver. */
  async contentOf(imageId: string): Promise<{ sha256: string; sizeBytes: number; loginUser: string | null } | null> {
    const img = await repo.getImage(this.deps.db, imageId, null);
    return img?.sha256 && img.size_bytes !== null
      ? { sha256: img.sha256, sizeBytes: img.size_bytes, loginUser: img.login_user }
      : null;
  }

  /** The images a node's host must be able to download (customer images its VMs are being built from). */
  async imagesForNode(node: string): Promise<string[]> {
    return repo.imagesForNode(this.deps.db, node);
  }

  /** Whether a snapshot is waiting to be taken (the manual clock's advance runs the job while one is). */
  async anyCreating(): Promise<boolean> {
    return (await this.deps.db.query(`SELECT 1 FROM user_images WHERE state = 'creating' LIMIT 1`)).rows.length > 0;
  }

  /**
   * The background job: takes one waiting snapshot (claimed under a lease, so one instance takes it),
   * copies the export into the store and makes the image ready, or failed with the reason. Returns
   * 1 when it took one, 0 when none was waiting.
   */
  async takeDue(): Promise<number> {
    const token = newId();
    const realNow = realTimeMs();
    const img = await this.deps.db.transaction((tx) =>
      repo.claimCreating(tx, new Date(realNow), new Date(realNow + SNAPSHOT_LEASE_MS), token),
    );
    if (!img) return 0;
    let ref: VmRef | null = null;
    try {
      ref = img.source_vm_id ? await this.deps.currentSource(img.source_vm_id) : null;
      if (!ref) throw new Error('the VM was destroyed or started before its disk was copied');
      const exported = await this.deps.driver.exportDisk(ref);
      let sha256: string | null = null;
      let size: number;
      if (exported) {
        size = await this.deps.store.importFrom(exported);
        sha256 = exported.sha256;
      } else {
        // A simulated VM's disk holds nothing to copy: its image is as large as the disk.
        size = img.disk_gb * 2 ** 30;
      }
      await this.finish(img, token, { state: 'ready', sha256, size_bytes: size });
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      this.deps.log?.warn({ image: img.id, err: message }, 'snapshot failed');
      await this.finish(img, token, { state: 'failed', error: message.slice(0, 500) });
    } finally {
      if (ref) await this.deps.driver.dropExport(ref).catch(() => undefined);
    }
    return 1;
  }

  private async finish(img: UserImageRow, token: string, patch: Partial<UserImageRow>): Promise<void> {
    await this.deps.db.transaction(async (tx) => {
      if (!(await repo.reclaim(tx, img.id, token))) return; // another instance took it over
      const now = this.deps.clock.now();
      await repo.updateImage(tx, img.id, {
        ...patch,
        claim_token: null,
        claimed_until: null,
        ...(patch.state === 'ready' ? { ready_at: now, billed_until: now } : {}),
      });
    });
  }
}
