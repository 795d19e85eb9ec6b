/**
 * Which external programs the agent tests can use. A test that needs one is
 * skipped when it is missing, with the Debian package to install, unless
 * GPUCLOUD_REQUIRE_QEMU=1 (CI): then `skip` is false and `ensure()` (called
 * first by such tests) fails with the same message.
 */
import { qemuAvailable } from '../../src/host-agent/qemu/process.js';

export interface Tool {
  binary: string;
  /** The reason to skip, or false when the test must run. */
  skip: string | false;
  /** Throws when the tool is missing (only reached when it is required). */
  ensure(): void;
}

const required = process.env.GPUCLOUD_REQUIRE_QEMU === '1';

function tool(binary: string, debianPackage: string): Tool {
  const present = qemuAvailable(binary);
  const missing = `${binary} not found: apt-get install ${debianPackage}`;
  return {
    binary,
    skip: present || required ? false : missing,
    ensure() {
      if (!present) throw new Error(`GPUCLOUD_REQUIRE_QEMU=1 but ${missing}`);
    },
  };
}

export const qemu = tool('qemu-system-x86_64', 'qemu-system-x86');
export const qemuImg = tool('qemu-img', 'qemu-utils');
export const genisoimage = tool('genisoimage', 'genisoimage');
