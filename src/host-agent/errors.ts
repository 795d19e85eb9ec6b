/**
 * What the agent's routes answer on failure: an AgentError becomes `{detail, code}` with its status
 * (server.ts, tunnel.ts). In a file of its own so that any part of the agent can throw one without
 * importing the VM manager.
 */
export class AgentError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = 'AgentError';
  }
}

/** A VM id: the control plane's UUID, checked before it names a folder or a queue. */
export const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
