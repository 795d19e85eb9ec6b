/** GET /billing/usage and GET /billing/current-spend (docs/billing.md#usage-and-current-spend). */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { DateTime, errorResponses } from '../../http/schemas.js';
import { requirePrincipal } from '../../http/principal.js';
import type { UsageService } from './usage.js';

const UsageReport = Type.Object(
  {
    logs: Type.Array(
      Type.Object({
        id: Type.String(),
        vm_id: Type.String(),
        timestamp: DateTime('End of the period the log covers'),
        gpu_seconds: Type.Number({ description: 'GPU-seconds: seconds running x GPUs' }),
        storage_gb: Type.Number(),
        network_bytes: Type.Number(),
        gpu_cost: Type.Number(),
        storage_cost: Type.Number(),
        network_cost: Type.Number(),
        total_cost: Type.Number(),
      }),
    ),
    image_logs: Type.Array(
      Type.Object({
        id: Type.String(),
        image_id: Type.String(),
        name: Type.String({ description: "The image's name" }),
        timestamp: DateTime('End of the period the log covers'),
        size_gb: Type.Number({ description: 'GB (10^9 bytes) stored' }),
        hours: Type.Number({ description: 'Length of the period in hours' }),
        cost: Type.Number(),
      }),
      { description: 'Storage of your private images (GET /images), one log per image and period' },
    ),
    total_cost: Type.Number({ description: 'Every VM log and every image log of the period' }),
    total_hours: Type.Number({ description: 'Hours the VMs ran (GPU time, wall clock)' }),
    period_start: Type.String({ description: 'YYYY-MM-DD' }),
    period_end: Type.String({ description: 'YYYY-MM-DD' }),
    vm_breakdown: Type.Array(
      Type.Object({
        vm_id: Type.String(),
        vmid: Type.Integer(),
        gpu_model: Type.String(),
        hours: Type.Number(),
        cost: Type.Number(),
      }),
    ),
  },
  { description: 'Usage between two dates' },
);

const CurrentSpend = Type.Object(
  {
    total_per_hour: Type.Number(),
    total_per_day: Type.Number(),
    total_per_month: Type.Number({ description: 'total_per_hour x 730' }),
    hourly_rate: Type.Number(),
    running_vms: Type.Integer(),
    vms: Type.Array(
      Type.Object({
        vm_id: Type.String(),
        vmid: Type.Integer(),
        gpu_type: Type.String(),
        gpu_count: Type.Integer(),
        storage_gb: Type.Integer(),
        gpu_cost_per_hour: Type.Number(),
        storage_cost_per_hour: Type.Number(),
        network_cost_per_hour: Type.Number(),
        total_cost_per_hour: Type.Number(),
      }),
    ),
    images: Type.Array(
      Type.Object({
        image_id: Type.String(),
        name: Type.String(),
        size_gb: Type.Number(),
        cost_per_hour: Type.Number(),
      }),
      { description: 'Your ready private images, at their storage rate' },
    ),
    last_updated: DateTime(),
  },
  {
    description:
      'What accrues now: running VMs at their full rate, other VMs that have run at their storage rate, ready images at theirs',
  },
);

export function usageRoutes(app: FastifyInstance, usage: UsageService): void {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  r.get(
    '/billing/usage',
    {
      schema: {
        tags: ['billing'],
        operationId: 'getUsage',
        summary: 'Usage history',
        description:
          'start_date and end_date are UTC days (YYYY-MM-DD), inclusive; the default is the last 30 days. start after end is 422.',
        querystring: Type.Object(
          {
            start_date: Type.Optional(
              Type.String({
                maxLength: 10,
                examples: ['2026-11-01'],
                description: 'First UTC day (YYYY-MM-DD), inclusive',
              }),
            ),
            end_date: Type.Optional(
              Type.String({
                maxLength: 10,
                examples: ['2026-11-30'],
                description: 'Last UTC day (YYYY-MM-DD), inclusive',
              }),
            ),
          },
          { additionalProperties: false },
        ),
        response: { 200: UsageReport, ...errorResponses(401, 403, 422, 429) },
      },
      config: { auth: 'user', scopes: ['read_only', 'billing_only'], cache: 'no-store' },
    },
    async (req) => usage.report(requirePrincipal(req.principal).userId, req.query),
  );
  r.get(
    '/billing/current-spend',
    {
      schema: {
        tags: ['billing'],
        operationId: 'getCurrentSpend',
        summary: 'Current spend rate',
        description:
          'What your VMs and images cost per hour right now: running VMs at their full rate, VMs that are stopped but keep a disk at their storage rate, and ready images at the image storage price.',
        response: { 200: CurrentSpend, ...errorResponses(401, 403, 429) },
      },
      config: { auth: 'user', scopes: ['read_only', 'billing_only'], cache: 'no-store' },
    },
    async (req) => usage.currentSpend(requirePrincipal(req.principal).userId),
  );
}
