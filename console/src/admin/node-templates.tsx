/**
 * Each template's state on one node's host, on the operator's Nodes page:
 * missing, queued, downloading (with its progress), ready, or failed with the
 * reason. Read when opened, and every few seconds while open (a download
 * moves).
 */
import { useState } from 'preact/hooks';
import type { paths } from '../../../src/sdk/index.js';
import { api, call } from '../api.js';
import { Loaded, useAsync } from '../ui.js';

type NodeTemplate =
  paths['/admin/nodes/{node}/templates']['get']['responses'][200]['content']['application/json'][number];

const POLL_MS = 5000;

/** "downloading 45%", "failed", "ready (added on the host)". */
function stateText(s: NodeTemplate): string {
  if (s.state === 'downloading') return `downloading ${s.progress ?? 0}%`;
  if (s.state === 'ready' && s.source === 'local') return 'ready (added on the host)';
  return s.state;
}

export function NodeTemplates({ node }: { node: string }) {
  const [open, setOpen] = useState(false);
  return (
    <details
      class="adm-host adm-node-templates"
      onToggle={(e) => setOpen((e.currentTarget as HTMLDetailsElement).open)}
    >
      <summary>Templates</summary>
      {open ? <States node={node} /> : null}
    </details>
  );
}

function States({ node }: { node: string }) {
  const states = useAsync(
    () => call(api.GET('/admin/nodes/{node}/templates', { params: { path: { node } } })),
    [node],
    POLL_MS,
  );
  return (
    <Loaded value={states}>
      {(list) =>
        list.length === 0 ? (
          <p class="muted adm-small">No template is meant for this node.</p>
        ) : (
          <ul class="adm-list adm-small" aria-label={`Templates on ${node}`}>
            {list.map((s) => (
              <li key={s.template_vmid} data-state={s.state}>
                <strong>{s.template_vmid}</strong> {s.name ?? <span class="muted">(not in the catalogue)</span>}:{' '}
                <span class={s.state === 'failed' || s.state === 'missing' ? 'adm-warn' : undefined}>
                  {stateText(s)}
                </span>
                {s.state === 'downloading' ? (
                  <progress
                    max={100}
                    value={s.progress ?? 0}
                    aria-label={`Template ${s.template_vmid} downloaded on ${node}`}
                  />
                ) : null}
                {s.state === 'failed' && s.reason ? <div class="adm-node-reason">{s.reason}</div> : null}
              </li>
            ))}
          </ul>
        )
      }
    </Loaded>
  );
}
