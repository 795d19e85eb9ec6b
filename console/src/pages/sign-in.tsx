/** Sign in (with the two-factor step when it is on) and create an account. */
import { useState } from 'preact/hooks';
import type { Account } from '../../../src/sdk/index.js';
import { api, call, client } from '../api.js';
import { Field, Form, Link, Submit, notify } from '../ui.js';

export function SignIn({ onSignedIn }: { onSignedIn: (a: Account) => void }) {
  const [email, setEmail] = useState('');
  const [password, setPassword] = useState('');
  const [challenge, setChallenge] = useState<string | undefined>(undefined);
  const [code, setCode] = useState('');

  const finish = async () => onSignedIn(await call(api.GET('/account')));

  if (challenge) {
    return (
      <div class="card auth">
        <h1>Two-factor authentication</h1>
        <p class="muted">Enter the 6-digit code from your authenticator app, or one of your recovery codes.</p>
        <Form
          onSubmit={async () => {
            await client.verify2fa(challenge, code.trim());
            await finish();
          }}
        >
          <Field
            label="Code"
            value={code}
            onInput={(e) => setCode(e.currentTarget.value)}
            autoComplete="one-time-code"
            inputMode="numeric"
            required
            autoFocus
          />
          <Submit>Sign in</Submit>
          <button
            type="button"
            class="btn btn-plain"
            onClick={() => {
              setChallenge(undefined);
              setCode('');
            }}
          >
            Back
          </button>
        </Form>
      </div>
    );
  }

  return (
    <div class="card auth">
      <h1>Sign in to gpucloud</h1>
      <Form
        onSubmit={async () => {
          const r = await client.login(email.trim(), password);
          if ('two_factor_required' in r) {
            setChallenge(r.challenge_token);
            return;
          }
          await finish();
        }}
      >
        <Field
          label="Email"
          type="email"
          value={email}
          onInput={(e) => setEmail(e.currentTarget.value)}
          autoComplete="username"
          required
          autoFocus
        />
        <Field
          label="Password"
          type="password"
          value={password}
          onInput={(e) => setPassword(e.currentTarget.value)}
          autoComplete="current-password"
          required
        />
        <Submit>Sign in</Submit>
      </Form>
      <p>
        New here? <Link href="/sign-up">Create account</Link>
      </p>
    </div>
  );
}

export function SignUp({ onSignedIn }: { onSignedIn: (a: Account) => void }) {
  const [email, setEmail] = useState('');
  const [password, setPassword] = useState('');
  return (
    <div class="card auth">
      <h1>Create your account</h1>
      <Form
        onSubmit={async () => {
          await call(api.POST('/auth/register', { body: { email: email.trim(), password } }));
          const r = await client.login(email.trim(), password);
          if ('two_factor_required' in r) throw new Error('Unexpected two-factor challenge for a new account');
          notify('Welcome to gpucloud. Add credit and an SSH key, then rent a GPU.');
          onSignedIn(await call(api.GET('/account')));
        }}
      >
        <Field
          label="Email"
          type="email"
          value={email}
          onInput={(e) => setEmail(e.currentTarget.value)}
          autoComplete="username"
          required
          autoFocus
        />
        <Field
          label="Password"
          type="password"
          value={password}
          onInput={(e) => setPassword(e.currentTarget.value)}
          autoComplete="new-password"
          required
          hint="At least 12 characters."
        />
        <Submit>Create account</Submit>
      </Form>
      <p>
        Already have an account? <Link href="/sign-in">Sign in</Link>
      </p>
    </div>
  );
}
