/**
 * The template catalogue, for everyone signed in: what each template is, its
 * login user and web services, its smallest disk, and the nodes where it is
 * ready now, each a link to launch it there.
 */
import { accessText, useTemplates } from '../templates.js';
import { Empty, Link, Loaded, Page, Table } from '../ui.js';

/** Nodes listed by name before the rest is counted. */
const NODES_SHOWN = 6;

export function Templates(_props: Record<string, unknown>) {
  const templates = useTemplates(30_000);
  return (
    <Page
      title="Templates"
      actions={
        <Link href="/offers" class="btn btn-plain">
          Offers
        </Link>
      }
    >
      <p class="muted">
        A VM is built from a template: its operating system, the user you log in as (with passwordless sudo), and the
        web services it serves in the browser through the access portal. A template can be launched on the nodes whose
        hosts hold it ready.
      </p>
      <Loaded value={templates}>
        {(list) =>
          list.length === 0 ? (
            <Empty>No templates yet.</Empty>
          ) : (
            <Table
              class="templates"
              head={
                <>
                  <th scope="col">Template</th>
                  <th scope="col">Operating system</th>
                  <th scope="col">Login</th>
                  <th scope="col">Access</th>
                  <th scope="col" class="num">
                    Min disk
                  </th>
                  <th scope="col">Ready on</th>
                </>
              }
            >
              {list.map((t) => (
                <tr key={t.template_vmid} data-template={t.template_vmid}>
                  <td>
                    <strong>{t.name}</strong> <span class="muted">({t.template_vmid})</span>
                    <div class="cell-sub">{t.description}</div>
                  </td>
                  <td>{t.os}</td>
                  <td>
                    <code>{t.default_user}</code>
                  </td>
                  <td>{accessText(t)}</td>
                  <td class="num">{t.min_disk_gb} GB</td>
                  <td>
                    {t.ready_on.nodes.length === 0 ? (
                      <span class="muted">no node yet</span>
                    ) : (
                      <>
                        <span class="cell-sub">{t.ready_on.gpu_types.join(', ')}: </span>
                        {t.ready_on.nodes.slice(0, NODES_SHOWN).map((n, i) => (
                          <span key={n}>
                            {i > 0 ? ', ' : ''}
                            <Link
                              href={`/offers/${encodeURIComponent(n)}/launch?template=${t.template_vmid}`}
                              title={`Launch ${t.name} on ${n}`}
                            >
                              {n}
                            </Link>
                          </span>
                        ))}
                        {t.ready_on.nodes.length > NODES_SHOWN ? (
                          <span class="muted"> and {t.ready_on.nodes.length - NODES_SHOWN} more</span>
                        ) : null}
                      </>
                    )}
                  </td>
                </tr>
              ))}
            </Table>
          )
        }
      </Loaded>
    </Page>
  );
}
