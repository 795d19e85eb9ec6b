/** `gpucloud events`: what happened to your VMs, money, keys and account, listed or followed (docs/events.md). */
import type { ApiEvent, FollowEventsOptions } from '../sdk/index.js';
import { call, flag, int, printJson, str, type Command } from './command.js';
import { vmPath } from './vms.js';

/** One line about an event: its VM and what its data says, most useful fields first. */
function describeEvent(e: { vm_id: string | null; data: Record<string, unknown> }): string {
  const d = e.data;
  const parts: string[] = [];
  if (d.vmid !== undefined) parts.push(`VM ${d.vmid}`);
  if (d.from !== undefined && d.to !== undefined) parts.push(`${d.from} -> ${d.to}`);
  if (d.reason !== undefined) parts.push(`(${d.reason})`);
  const shown = new Set(['vmid', 'from', 'to', 'reason']);
  const rest = Object.entries(d).filter(([k]) => !shown.has(k));
  if (rest.length) parts.push(rest.map(([k, v]) => `${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`).join(' '));
  return parts.join(' ');
}

export const EVENT_COMMANDS: Command[] = [
  {
    path: 'events',
    summary: 'What happened to your VMs, money, keys and account, oldest first',
    example: ['gpucloud events --type vm.status_changed,vm.interrupted', 'gpucloud events --vm 1042 --follow'],
    options: [
      ['--after <ID>', 'Only events after this one'],
      ['--type <T>', 'Only these types (repeat, or separate with commas)', { repeatable: true }],
      ['--vm <VM>', 'Only events about this VM (id or vmid)'],
      ['--limit <N>', 'At most N events (1-200, default 50)'],
      ['--follow', 'Print events as they happen, after --after or from now on (Ctrl-C ends)'],
    ],
    async run(ctx) {
      const client = ctx.client();
      const query: { after?: string; type?: string[]; vm_id?: string; limit?: number } = {};
      if (str(ctx, 'after')) query.after = str(ctx, 'after');
      const types = ctx.values.type;
      if (Array.isArray(types) && types.length) query.type = types.filter((t): t is string => typeof t === 'string');
      const vm = str(ctx, 'vm');
      if (vm) query.vm_id = (await call(client.api.GET('/vms/{vm_id}', vmPath(vm)))).id;
      const limit = int(ctx, 'limit', { min: 1, max: 200 });
      if (limit !== undefined) query.limit = limit;
      const follow = flag(ctx, 'follow');
      const print = (e: ApiEvent) =>
        ctx.out(ctx.json ? JSON.stringify(e) : `${e.created_at}  ${e.type.padEnd(22)} ${describeEvent(e)}`);
      if (!follow) {
        const events = await call(client.api.GET('/events', { params: { query } }));
        if (ctx.json) return printJson(ctx, events);
        if (events.length === 0) return ctx.out('No events');
        return events.forEach(print);
      }
      // With --after: what came after it, then live (one JSON object a line with --json); without: from now on.
      const stop = new AbortController();
      process.once('SIGINT', () => stop.abort());
      process.once('SIGTERM', () => stop.abort());
      const opts: FollowEventsOptions = { signal: stop.signal };
      if (query.after) opts.after = query.after;
      if (query.type) opts.types = query.type;
      if (query.vm_id) opts.vmId = query.vm_id;
      for await (const e of client.followEvents(opts)) print(e);
    },
  },
];
