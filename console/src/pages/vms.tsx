/**
 * Your VMs: the list, with live status (the VM's events read it again), the
 * destroyed ones on request, and pages of 50. One VM's page: vm-detail.tsx.
 */
import { useState } from 'preact/hooks';
import { api, callWithTotal } from '../api.js';
import { navigate } from '../router.js';
import { useLiveEvents, VM_EVENTS } from '../live.js';
import {
  Empty,
  Link,
  Loaded,
  Money,
  Page,
  Status,
  Table,
  WithTimes,
  formatInstants,
  formatTime,
  useAsync,
  vmName,
} from '../ui.js';
import { RENTAL_LABELS } from './offers.js';

const PAGE_SIZE = 50;

export function Vms(_props: Record<string, unknown>) {
  const [showDestroyed, setShowDestroyed] = useState(false);
  const [page, setPage] = useState(0);
  const list = useAsync(async () => {
    return callWithTotal(
      api.GET('/vms', {
        params: { query: { include_destroyed: showDestroyed, limit: PAGE_SIZE, offset: page * PAGE_SIZE } },
      }),
    );
  }, [showDestroyed, page]);
  useLiveEvents(VM_EVENTS, () => void list.reload());

  return (
    <Page
      title="VMs"
      actions={
        <Link href="/offers" class="btn btn-primary">
          Rent a GPU
        </Link>
      }
    >
      <div class="actions vm-list-controls">
        <label class="vm-toggle">
          <input
            type="checkbox"
            checked={showDestroyed}
            onChange={(e) => {
              setShowDestroyed(e.currentTarget.checked);
              setPage(0);
            }}
          />{' '}
          Show destroyed VMs
        </label>
        <span class="muted">Status updates live.</span>
      </div>
      <Loaded value={list}>
        {({ items, total }) =>
          items.length === 0 ? (
            <Empty>
              {page > 0 ? (
                'No more VMs.'
              ) : (
                <>
                  {showDestroyed ? 'You have no VMs.' : 'You have no VMs right now.'}{' '}
                  <Link href="/offers">Find a GPU</Link> to launch one.
                </>
              )}
            </Empty>
          ) : (
            <>
              <Table
                head={
                  <>
                    <th scope="col">VM</th>
                    <th scope="col">Status</th>
                    <th scope="col">GPUs</th>
                    <th scope="col">Node</th>
                    <th scope="col">Rental</th>
                    <th scope="col" class="num">
                      Rate
                    </th>
                    <th scope="col">Created</th>
                  </>
                }
              >
                {items.map((v) => (
                  <tr
                    key={v.id}
                    class="clickable"
                    onClick={(e) => {
                      // The name is a real link (keyboard, new tab); a click anywhere else on the row opens it too.
                      if ((e.target as HTMLElement).closest('a, button, input, label')) return;
                      if (getSelection()?.toString()) return;
                      navigate(`/vms/${v.id}`);
                    }}
                  >
                    <td>
                      <Link href={`/vms/${v.id}`} title={`ID ${v.id}`}>
                        {vmName(v)}
                      </Link>
                    </td>
                    <td>
                      <Status status={v.status} />
                      {v.failure_reason ? (
                        <span class="cell-sub vm-failure-hint" title={formatInstants(v.failure_reason)}>
                          <WithTimes text={v.failure_reason} />
                        </span>
                      ) : null}
                    </td>
                    <td>
                      {v.gpu_count} × {v.gpu_type}
                    </td>
                    <td>{v.node}</td>
                    <td>{RENTAL_LABELS[v.rental_type]}</td>
                    <td class="num">
                      <Money value={v.hourly_rate} precise perHour />
                    </td>
                    <td>{formatTime(v.created_at)}</td>
                  </tr>
                ))}
              </Table>
              {total > PAGE_SIZE ? (
                <div class="actions vm-pager">
                  <button type="button" class="btn btn-plain" disabled={page === 0} onClick={() => setPage(page - 1)}>
                    Newer
                  </button>
                  <span class="muted">
                    {page * PAGE_SIZE + 1}–{page * PAGE_SIZE + items.length} of {total}
                  </span>
                  <button
                    type="button"
                    class="btn btn-plain"
                    disabled={(page + 1) * PAGE_SIZE >= total}
                    onClick={() => setPage(page + 1)}
                  >
                    Older
                  </button>
                </div>
              ) : null}
            </>
          )
        }
      </Loaded>
    </Page>
  );
}
