/**
 * The host side of the portal benchmark, in a process of its own so that its
 * CPU is not the load generator's: a stand-in host agent (the agent API's
 * tunnel, test/helpers/fake-agent.ts) whose tunnel leads to a stand-in guest
 * app on this machine (test/helpers/guest-app.ts) instead of a VM under TCG.
 * Prints one JSON line `{agentUrl, token, guestPort}` and runs until killed.
 */
import { randomBytes } from 'node:crypto';
import { FakeAgent } from '../test/helpers/fake-agent.js';
import { startGuestApp } from '../test/helpers/guest-app.js';

const guest = await startGuestApp('bench-guest');
const token = randomBytes(24).toString('hex');
const agent = new FakeAgent(token);
agent.hostGpus = 8;
agent.bootPolls = 0;
agent.templates = [{ vmid: 102, user: 'root' }];
agent.guestPorts.set(7860, guest.port);
agent.guestPorts.set(8888, guest.port);
await agent.start();
console.log(JSON.stringify({ agentUrl: agent.url, token, guestPort: guest.port }));
