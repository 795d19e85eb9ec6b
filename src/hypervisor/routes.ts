/** POST /admin/simulator/faults (see docs/vms.md#simulated-and-real-vms): arm failures of the simulated hypervisor. */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { Enum, errorResponses, MessageResponse } from '../http/schemas.js';
import { notFound } from '../errors.js';
import { UUID_RE } from '../ids.js';
import type { HypervisorDriver } from './driver.js';
import { SIM_ACTIONS, SimulatorDriver } from './simulator.js';

/** `inventory.getNode` answers 404 for a node that does not exist. */
export function simulatorRoutes(
  app: FastifyInstance,
  driver: HypervisorDriver,
  inventory: { getNode(node: string): Promise<unknown> },
): void {
  app.withTypeProvider<TypeBoxTypeProvider>().post(
    '/admin/simulator/faults',
    {
      schema: {
        tags: ['admin'],
        operationId: 'injectSimulatorFaults',
        summary: 'Make the simulated hypervisor fail',
        description:
          'The next `count` (default 1) driver calls of `action` on the node (or only on the VM `vm_id` of that node) fail. A failed provision ends the VM failed, a failed start returns it to stopped, a failed move leaves it stopped where it was, a failed snapshot leaves its image failed, a failed stop or destroy is retried with backoff (5 s up to 5 min). 404 for an unknown node, or with any driver other than the simulator.',
        body: Type.Object(
          {
            node: Type.String({ minLength: 1, maxLength: 200 }),
            action: Enum(SIM_ACTIONS),
            count: Type.Optional(Type.Integer({ minimum: 0, maximum: 1000, default: 1 })),
            vm_id: Type.Optional(Type.String({ description: 'Limit the fault to this VM (uuid)' })),
          },
          { additionalProperties: false, examples: [{ node: 'vm01', action: 'provision', count: 1 }] },
        ),
        response: { 200: MessageResponse, ...errorResponses(401, 403, 404, 415, 422, 429) },
      },
      config: { auth: 'admin', scopes: [], cache: 'no-store' },
    },
    async (req) => {
      if (!(driver instanceof SimulatorDriver)) throw notFound('Simulator');
      await inventory.getNode(req.body.node); // 404 for an unknown node
      if (req.body.vm_id !== undefined && !UUID_RE.test(req.body.vm_id)) throw notFound('VM');
      const count = req.body.count ?? 1;
      await driver.injectFault({ node: req.body.node, vmId: req.body.vm_id }, req.body.action, count);
      return {
        message: `The next ${count} ${req.body.action} call(s) on ${req.body.vm_id ? `VM ${req.body.vm_id}` : `node ${req.body.node}`} will fail`,
      };
    },
  );
}
