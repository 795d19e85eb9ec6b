/**
 * The console's shell: who is signed in, the navigation, and which page a
 * path shows. Customers see their own pages; administrators also the
 * operator pages.
 */
import type { ComponentChildren } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import type { Account } from '../../src/sdk/index.js';
import { api, call, hasSession, onSessionEnd, signOut } from './api.js';
import { match, navigate, usePath } from './router.js';
import { Link, Notices } from './ui.js';
import { SignIn, SignUp } from './pages/sign-in.js';
import { Dashboard } from './pages/dashboard.js';
import { Offers } from './pages/offers.js';
import { Launch } from './pages/launch.js';
import { Templates } from './pages/templates.js';
import { Vms } from './pages/vms.js';
import { VmDetail } from './pages/vm-detail.js';
import { MyImages } from './pages/images.js';
import { SshKeys } from './pages/ssh-keys.js';
import { ApiKeys } from './pages/api-keys.js';
import { Billing } from './pages/billing.js';
import { Reservations } from './pages/reservations.js';
import { AccountPage } from './pages/account.js';
import { Nodes } from './admin/nodes.js';
import { Pricing } from './admin/pricing.js';
import { Users } from './admin/users.js';
import { AllVms } from './admin/vms.js';
import { TemplatesAdmin } from './admin/templates.js';
import { Images } from './admin/images.js';
import { ThemeToggle } from './theme.js';

const CUSTOMER_NAV = [
  ['/', 'Dashboard'],
  ['/offers', 'Offers'],
  ['/templates', 'Templates'],
  ['/vms', 'VMs'],
  ['/images', 'My images'],
  ['/ssh-keys', 'SSH keys'],
  ['/api-keys', 'API keys'],
  ['/billing', 'Billing'],
  ['/reservations', 'Reservations'],
  ['/account', 'Account'],
] as const;
const ADMIN_NAV = [
  ['/admin/nodes', 'Nodes'],
  ['/admin/pricing', 'Pricing'],
  ['/admin/users', 'Users'],
  ['/admin/vms', 'Every VM'],
  ['/admin/templates', 'Catalogue'],
  ['/admin/images', 'Images'],
] as const;

export function App() {
  const path = usePath();
  const [account, setAccount] = useState<Account | null | undefined>(hasSession() ? undefined : null);

  useEffect(
    () =>
      onSessionEnd(() => {
        setAccount(null);
      }),
    [],
  );
  useEffect(() => {
    if (account !== undefined) return;
    call(api.GET('/account'))
      .then(setAccount)
      .catch(() => setAccount(null));
  }, [account]);

  if (account === undefined) {
    return (
      <main class="center" role="status">
        <span class="spinner" aria-hidden="true" /> Loading…
      </main>
    );
  }
  if (account === null) {
    return (
      <>
        <Notices />
        <main class="center">
          {path === '/sign-up' ? <SignUp onSignedIn={setAccount} /> : <SignIn onSignedIn={setAccount} />}
        </main>
      </>
    );
  }
  if (path === '/sign-in' || path === '/sign-up') {
    navigate('/', { replace: true });
  }
  return (
    <Shell account={account} path={path} onSignOut={() => setAccount(null)}>
      <Route path={path} account={account} onAccount={setAccount} />
    </Shell>
  );
}

function Shell(props: { account: Account; path: string; onSignOut: () => void; children: ComponentChildren }) {
  const [menuOpen, setMenuOpen] = useState(false);
  const nav = props.account.role === 'admin' ? [...CUSTOMER_NAV, ...ADMIN_NAV] : CUSTOMER_NAV;
  const active = (href: string) =>
    href === '/' ? props.path === '/' : props.path === href || props.path.startsWith(`${href}/`);
  useEffect(() => setMenuOpen(false), [props.path]);
  return (
    <>
      <a class="skip" href="#main">
        Skip to content
      </a>
      <header class="topbar">
        <Link href="/" class="brand">
          gpucloud
        </Link>
        <button
          type="button"
          class="btn btn-plain menu-toggle"
          aria-expanded={menuOpen}
          aria-controls="nav"
          onClick={() => setMenuOpen(!menuOpen)}
        >
          Menu
        </button>
        <nav id="nav" class={menuOpen ? 'open' : ''} aria-label="Main">
          {nav.map(([href, label]) => (
            <Link
              key={href}
              href={href}
              class={active(href) ? 'active' : ''}
              aria-current={active(href) ? 'page' : undefined}
            >
              {label}
            </Link>
          ))}
        </nav>
        <div class="who">
          <span class="muted email" title={props.account.email}>
            {props.account.email}
          </span>
          <ThemeToggle />
          <button
            type="button"
            class="btn btn-plain"
            onClick={async () => {
              await signOut();
              props.onSignOut();
              navigate('/', { replace: true });
            }}
          >
            Sign out
          </button>
        </div>
      </header>
      <Notices />
      <main id="main" tabIndex={-1}>
        {props.children}
      </main>
    </>
  );
}

function Route({ path, account, onAccount }: { path: string; account: Account; onAccount: (a: Account) => void }) {
  let m: Record<string, string> | undefined;
  if (path === '/') return <Dashboard />;
  if (path === '/offers') return <Offers />;
  if ((m = match('/offers/:node/launch', path))) return <Launch node={m.node!} />;
  if (path === '/templates') return <Templates />;
  if (path === '/vms') return <Vms />;
  if ((m = match('/vms/:id', path))) return <VmDetail id={m.id!} />;
  if (path === '/images') return <MyImages />;
  if (path === '/ssh-keys') return <SshKeys />;
  if (path === '/api-keys') return <ApiKeys />;
  if (path === '/billing') return <Billing />;
  if (path === '/reservations') return <Reservations />;
  if (path === '/account') return <AccountPage account={account} onAccount={onAccount} />;
  if (account.role === 'admin') {
    if (path === '/admin/nodes') return <Nodes />;
    if (path === '/admin/pricing') return <Pricing />;
    if (path === '/admin/users') return <Users />;
    if (path === '/admin/vms') return <AllVms />;
    if (path === '/admin/templates') return <TemplatesAdmin />;
    if (path === '/admin/images') return <Images />;
  }
  return (
    <section class="page">
      <h1>Not found</h1>
      <p>
        Nothing lives at this address. <Link href="/">Back to the dashboard</Link>
      </p>
    </section>
  );
}
