/** The account: who you are, the password, sessions, and two-factor authentication. */
import qrcode from 'qrcode-generator';
import { useMemo, useState } from 'preact/hooks';
import type { Account } from '../../../src/sdk/index.js';
import { api, call, errorMessage, signOut } from '../api.js';
import { navigate } from '../router.js';
import { Action, CopyButton, Field, Form, Link, Page, Submit, formatTime, notify } from '../ui.js';

export function AccountPage({ account, onAccount }: { account: Account; onAccount: (a: Account) => void }) {
  const refresh = async () => onAccount(await call(api.GET('/account')));
  return (
    <Page title="Account">
      <div class="grid2">
        <div class="card">
          <h2 class="card-heading">Profile</h2>
          <dl class="props">
            <dt>Email</dt>
            <dd>{account.email}</dd>
            <dt>Name</dt>
            <dd>{account.name ?? <span class="muted">—</span>}</dd>
            <dt>Role</dt>
            <dd>{account.role}</dd>
            <dt>Created</dt>
            <dd>{formatTime(account.created_at)}</dd>
            <dt>Two-factor</dt>
            <dd>{account.two_factor_enabled ? 'on' : 'off'}</dd>
          </dl>
        </div>
        <Sessions />
      </div>
      <div class="grid2 spaced">
        <ChangePassword />
        <TwoFactor account={account} refresh={refresh} />
      </div>
    </Page>
  );
}

function Sessions() {
  return (
    <div class="card">
      <h2 class="card-heading">Sessions</h2>
      <p>
        Signed in on a computer you no longer use, or think someone else is? End every session of this account, this one
        included. You will sign in again here. API keys keep working: <Link href="/api-keys">revoke them</Link> where
        they were made.
      </p>
      <div class="actions">
        <Action
          variant="danger"
          onClick={async () => {
            await call(api.POST('/auth/logout-all'));
            notify('Signed out everywhere.', 'info');
            await signOut();
            navigate('/', { replace: true });
          }}
        >
          End every session
        </Action>
      </div>
    </div>
  );
}

function ChangePassword() {
  const [current, setCurrent] = useState('');
  const [next, setNext] = useState('');
  return (
    <div class="card">
      <h2 class="card-heading">Change password</h2>
      <Form
        aria-label="Change password"
        onSubmit={async () => {
          const r = await call(
            api.POST('/account/password', { body: { current_password: current, new_password: next } }),
          );
          setCurrent('');
          setNext('');
          notify(r.message || 'Password changed.');
        }}
      >
        <Field
          label="Current password"
          type="password"
          value={current}
          onInput={(e) => setCurrent(e.currentTarget.value)}
          autoComplete="current-password"
          required
        />
        <Field
          label="New password"
          type="password"
          value={next}
          onInput={(e) => setNext(e.currentTarget.value)}
          autoComplete="new-password"
          minLength={12}
          required
          hint="At least 12 characters."
        />
        <p class="muted">
          Every other session of your account (other browsers and devices) is signed out; you stay signed in here.
        </p>
        <div class="actions">
          <Submit>Change password</Submit>
        </div>
      </Form>
    </div>
  );
}

function TwoFactor({ account, refresh }: { account: Account; refresh: () => Promise<void> }) {
  const [setup, setSetup] = useState<{ secret: string; otpauth_url: string } | undefined>(undefined);
  const [code, setCode] = useState('');
  const [recovery, setRecovery] = useState<string[] | undefined>(undefined);

  const start = async () => {
    const s = await call(api.POST('/auth/2fa/setup'));
    setCode('');
    setSetup(s);
  };

  return (
    <div class="card two-factor">
      <h2 class="card-heading">Two-factor authentication</h2>

      {recovery ? (
        <div class="recovery">
          <p class="warning" role="alert">
            Save these recovery codes now, somewhere other than your phone. Each one signs you in once if you lose your
            authenticator. They will not be shown again.
          </p>
          <ol class="recovery-codes mono">
            {recovery.map((c) => (
              <li key={c}>{c}</li>
            ))}
          </ol>
          <div class="actions">
            <CopyButton text={recovery.join('\n')} label="Copy recovery codes" />
            <button type="button" class="btn btn-plain btn-small" onClick={() => setRecovery(undefined)}>
              I have saved them
            </button>
          </div>
        </div>
      ) : null}

      {account.two_factor_enabled ? (
        <DisableTwoFactor refresh={refresh} />
      ) : setup ? (
        <>
          <p>
            <strong>1.</strong> Scan this QR code with your authenticator app (Google Authenticator, 1Password, Authy,
            …).
          </p>
          <QrCode text={setup.otpauth_url} />
          <p>Or type this secret into the app by hand:</p>
          <div class="secret">
            <code>{setup.secret}</code>
            <CopyButton text={setup.secret} label="Copy secret" />
          </div>
          <p>
            <strong>2.</strong> Enter the 6-digit code the app shows.
          </p>
          <Form
            aria-label="Enable two-factor authentication"
            onSubmit={async () => {
              const r = await call(api.POST('/auth/2fa/enable', { body: { code: code.trim() } }));
              // It is on now: show the recovery codes whatever happens next, then the account as it is.
              setRecovery(r.recovery_codes.length ? r.recovery_codes : undefined);
              notify(r.message || 'Two-factor authentication is on.');
              try {
                await refresh();
              } catch (e) {
                notify(errorMessage(e), 'error');
              } finally {
                setSetup(undefined);
                setCode('');
              }
            }}
          >
            <Field
              label="Code"
              value={code}
              onInput={(e) => setCode(e.currentTarget.value)}
              autoComplete="one-time-code"
              inputMode="numeric"
              placeholder="123456"
              maxLength={64}
              required
            />
            <p class="muted">Turning it on signs out your other sessions; you stay signed in here.</p>
            <div class="actions">
              <Submit>Enable</Submit>
              <Action onClick={start} title="Get a new secret and QR code">
                Start over
              </Action>
            </div>
          </Form>
        </>
      ) : (
        <>
          <p>
            Off. With it on, signing in also asks for a code from an authenticator app on your phone, so a stolen
            password alone is not enough.
          </p>
          <div class="actions">
            <Action variant="primary" onClick={start}>
              Set up two-factor authentication
            </Action>
          </div>
        </>
      )}
    </div>
  );
}

function DisableTwoFactor({ refresh }: { refresh: () => Promise<void> }) {
  const [code, setCode] = useState('');
  return (
    <>
      <p>
        <strong>On.</strong> Signing in asks for a code from your authenticator app (or a recovery code).
      </p>
      <Form
        aria-label="Disable two-factor authentication"
        onSubmit={async () => {
          const r = await call(api.POST('/auth/2fa/disable', { body: { code: code.trim() } }));
          setCode('');
          notify(r.message || 'Two-factor authentication is off.');
          await refresh();
        }}
      >
        <Field
          label="Code"
          value={code}
          onInput={(e) => setCode(e.currentTarget.value)}
          autoComplete="one-time-code"
          maxLength={64}
          required
          hint="A current 6-digit code from your app, or an unused recovery code. Other sessions are signed out."
        />
        <div class="actions">
          <Submit variant="danger">Disable</Submit>
        </div>
      </Form>
    </>
  );
}

/** A QR code drawn as SVG, one square per dark module, with the quiet zone around it. */
function QrCode({ text }: { text: string }) {
  const cells = useMemo(() => {
    const qr = qrcode(0, 'M');
    qr.addData(text);
    qr.make();
    const n = qr.getModuleCount();
    const dark: [number, number][] = [];
    for (let r = 0; r < n; r++) for (let c = 0; c < n; c++) if (qr.isDark(r, c)) dark.push([r, c]);
    return { n, dark };
  }, [text]);
  const quiet = 4;
  const size = cells.n + quiet * 2;
  return (
    <div class="qr">
      <svg
        xmlns="http://www.w3.org/2000/svg"
        viewBox={`0 0 ${size} ${size}`}
        role="img"
        aria-label="QR image for your authenticator app: scan it to add this account"
        shape-rendering="crispEdges"
      >
        <rect x={0} y={0} width={size} height={size} fill="#fff" />
        {cells.dark.map(([r, c]) => (
          <rect key={`${r}-${c}`} x={c + quiet} y={r + quiet} width={1} height={1} fill="#000" />
        ))}
      </svg>
    </div>
  );
}
