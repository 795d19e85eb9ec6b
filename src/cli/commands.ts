/**
 * The client commands of `gpucloud`, built only on the SDK, in the order
 * `gpucloud --help` lists them. Each command group has its file: a command is
 * a path ("vm create"), its arguments and options, a help text with an
 * example, and a run function (see command.ts); index.ts makes them commander
 * commands, parses argv and runs one.
 */
import type { Command } from './command.js';
import { ADMIN_COMMANDS } from './admin.js';
import { ADMIN_IMAGE_COMMANDS } from './admin-images.js';
import { ADMIN_TEMPLATE_COMMANDS } from './admin-templates.js';
import { AUTH_COMMANDS } from './auth.js';
import { BILLING_COMMANDS } from './billing.js';
import { EVENT_COMMANDS } from './events.js';
import { API_KEY_COMMANDS } from './keys.js';
import { IMAGE_COMMANDS } from './my-images.js';
import { OFFER_COMMANDS } from './offers.js';
import { RESERVATION_COMMANDS } from './reservations.js';
import { SSH_KEY_COMMANDS } from './ssh-keys.js';
import { TEMPLATE_COMMANDS } from './templates.js';
import { VM_COMMANDS } from './vms.js';
import { WEBHOOK_COMMANDS } from './webhooks.js';

export type { Command, Ctx } from './command.js';
export { saveTokens } from './auth.js';

export const COMMANDS: Command[] = [
  ...AUTH_COMMANDS,
  ...OFFER_COMMANDS,
  ...TEMPLATE_COMMANDS,
  ...SSH_KEY_COMMANDS,
  ...API_KEY_COMMANDS,
  ...EVENT_COMMANDS,
  ...WEBHOOK_COMMANDS,
  ...VM_COMMANDS,
  ...IMAGE_COMMANDS,
  ...BILLING_COMMANDS,
  ...RESERVATION_COMMANDS,
  ...ADMIN_COMMANDS,
  ...ADMIN_TEMPLATE_COMMANDS,
  ...ADMIN_IMAGE_COMMANDS,
];

/** What each group of subcommands is for, in `gpucloud <group> --help`. */
export const GROUP_SUMMARIES: Record<string, string> = {
  'ssh-keys': 'Your SSH public keys, which VMs can be logged in with',
  keys: 'Your API keys, the credentials of scripts and CI',
  webhooks: 'Endpoints that receive your events',
  vm: 'Rent, watch, control and reach VMs',
  billing: 'Your balance, usage, current spend and ledger',
  reservations: 'GPUs reserved for months at a discount',
  admin: 'Run the service: nodes, pricing, users, credit, every VM, templates and images (admin)',
  'admin templates': 'The template catalogue: add, change and delete templates (admin)',
  'admin images': 'Disk images in the image store: push, list and delete (admin)',
};
