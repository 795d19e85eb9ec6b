/**
 * The launch form's way in to the VM (launch.tsx): an SSH key of the user's, or a password.
 */
import type { paths } from '../../../src/sdk/index.js';
import { ErrorText, Field, Link, Select, type Async } from '../ui.js';

export type AuthMethod = 'ssh_key' | 'password';
type SshKey = paths['/ssh-keys']['get']['responses'][200]['content']['application/json'][number];

export const MIN_PASSWORD = 12;

export function Credentials(props: {
  keys: Async<SshKey[]>;
  auth: AuthMethod;
  setAuth: (a: AuthMethod) => void;
  keyId: string;
  setKeyId: (id: string) => void;
  password: string;
  setPassword: (p: string) => void;
}) {
  const { keys, auth, setAuth, keyId, setKeyId, password, setPassword } = props;
  const keyList = keys.data ?? [];
  return (
    <>
      <Select
        label="Access method"
        value={auth}
        onChange={(v) => setAuth(v === 'password' ? 'password' : 'ssh_key')}
        options={[
          { value: 'ssh_key', label: 'SSH key' },
          { value: 'password', label: 'Password' },
        ]}
      />
      {auth === 'ssh_key' ? (
        keys.data === undefined ? (
          keys.error ? (
            <ErrorText error={keys.error} />
          ) : (
            <p class="muted" role="status">
              <span class="spinner" aria-hidden="true" /> Loading your SSH keys…
            </p>
          )
        ) : keyList.length ? (
          <Select
            label="SSH key"
            value={keyId}
            onChange={setKeyId}
            options={keyList.map((k) => ({
              value: k.id,
              label: `${k.label} (${k.key_type}, ${k.fingerprint.slice(0, 19)}…)`,
            }))}
          />
        ) : (
          <p class="warning">
            You have no SSH key yet. <Link href="/ssh-keys">Add an SSH key</Link>, or choose Password as the access
            method.
          </p>
        )
      ) : (
        <>
          {keys.data && keyList.length === 0 ? (
            <p class="muted">
              You have no SSH key, so the VM is reached with a password. To use a key instead,{' '}
              <Link href="/ssh-keys">add an SSH key</Link>.
            </p>
          ) : null}
          <Field
            label="Password"
            type="password"
            value={password}
            onInput={(e) => setPassword(e.currentTarget.value)}
            autoComplete="new-password"
            minLength={MIN_PASSWORD}
            maxLength={128}
            hint={
              password && password.length < MIN_PASSWORD
                ? `${MIN_PASSWORD - password.length} more characters needed (at least ${MIN_PASSWORD}).`
                : `At least ${MIN_PASSWORD} characters. For signing in to the VM; it is not shown again.`
            }
          />
        </>
      )}
    </>
  );
}
