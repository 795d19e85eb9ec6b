/**
 * What the portal itself answers on a VM's host name (docs/portal.md): the
 * launch page and its script, and the pages of the cases where there is no
 * app to show (not signed in, VM not running, simulated VM, app not
 * answering). Browsers get a small HTML page, other clients the API's error
 * shape `{detail, code}`. The portal's own paths live under `/.gpucloud/`,
 * which is never passed to the guest.
 *
 * Pages carry a strict Content-Security-Policy: no inline script or style;
 * the launch script and the stylesheet are files of their own.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';

export const OWN_PREFIX = '/.gpucloud/';

export const PAGE_CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const escape = (s: string) =>
  s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);

export const PORTAL_CSS = `body{font:16px/1.5 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
main{max-width:34rem;margin:12vh auto;padding:2rem;background:#fff;border-radius:12px;box-shadow:0 1px 4px #0002}
h1{font-size:1.3rem;margin:0 0 .75rem}p{margin:.5rem 0}code{background:#eef0f4;padding:0 .25rem;border-radius:4px}
.muted{color:#5b6475;font-size:.9rem}
`;

/** Reads the token from the fragment, trades it for the cookie, then opens the app. */
export const LAUNCH_JS = `(function () {
  var msg = document.getElementById('msg');
  var m = /[#&]launch_token=([A-Za-z0-9._-]+)/.exec(location.hash);
  history.replaceState(null, '', location.pathname);
  if (!m) { msg.textContent = 'This link carries no launch token. Open the service again from the console or with gpucloud vm open.'; return; }
  fetch('/.gpucloud/session', { method: 'POST', headers: { 'content-type': 'application/json' }, credentials: 'same-origin', body: JSON.stringify({ launch_token: m[1] }) })
    .then(function (r) {
      if (r.status === 204) { location.replace('/'); return; }
      return r.json().then(function (e) { msg.textContent = e.detail || ('The portal answered ' + r.status); });
    })
    .catch(function () { msg.textContent = 'The portal could not be reached. Try again.'; });
})();
`;

export function page(title: string, paragraphs: string[], script = false): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>${escape(title)}</title><link rel="stylesheet" href="${OWN_PREFIX}portal.css"></head>
<body><main><h1>${escape(title)}</h1>${paragraphs.map((p, i) => `<p${i === 0 && script ? ' id="msg"' : ''}>${escape(p)}</p>`).join('')}
<p class="muted">gpucloud access portal</p></main>${script ? `<script src="${OWN_PREFIX}launch.js"></script>` : ''}</body></html>
`;
}

export function wantsHtml(req: IncomingMessage): boolean {
  return /\btext\/html\b/.test(req.headers.accept ?? '');
}

const SECURITY_HEADERS = {
  'content-security-policy': PAGE_CSP,
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'cache-control': 'no-store',
  'x-frame-options': 'DENY',
};

/** The portal's own answer: an HTML page for a browser, else `{detail, code}`. */
export function answer(
  req: IncomingMessage,
  res: ServerResponse,
  status: number,
  code: string,
  title: string,
  detail: string,
  more: string[] = [],
): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const html = wantsHtml(req);
  const body = html ? page(title, [detail, ...more]) : JSON.stringify({ detail, code });
  res.writeHead(status, {
    ...SECURITY_HEADERS,
    'content-type': html ? 'text/html; charset=utf-8' : 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(body),
  });
  res.end(req.method === 'HEAD' ? undefined : body);
}

/** A static file of the portal's own. */
export function asset(res: ServerResponse, type: string, body: string): void {
  res.writeHead(200, {
    ...SECURITY_HEADERS,
    'cache-control': 'public, max-age=300',
    'content-type': type,
    'content-length': Buffer.byteLength(body),
  });
  res.end(body);
}

export function launchPage(res: ServerResponse): void {
  const body = page('Opening…', ['Signing you in to this VM…'], true);
  res.writeHead(200, {
    ...SECURITY_HEADERS,
    'content-type': 'text/html; charset=utf-8',
    'content-length': Buffer.byteLength(body),
  });
  res.end(body);
}

/** A raw HTTP answer on a socket (an upgrade the portal refuses). */
export { rawAnswer as refuseUpgrade } from '../../net/streams.js';
