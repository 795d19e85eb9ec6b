/**
 * The first screen after sign-in: balance, what is spent per hour now, running VMs, and a warning when credit runs
 * low.
 */
import { api, call } from '../api.js';
import { Empty, Link, Loaded, Money, Page, Status, Table, useAsync, vmName } from '../ui.js';

/** Below this many hours of credit at the current spend, the dashboard warns. */
const LOW_HOURS = 24;

export function Dashboard() {
  const data = useAsync(
    async () => {
      const [balance, spend, vms] = await Promise.all([
        call(api.GET('/billing/balance')),
        call(api.GET('/billing/current-spend')),
        call(api.GET('/vms', { params: { query: { limit: 100 } } })),
      ]);
      return { balance, spend, vms };
    },
    [],
    5000,
  );
  return (
    <Page title="Dashboard">
      <Loaded value={data}>
        {({ balance, spend, vms }) => {
          const hoursLeft = spend.total_per_hour > 0 ? balance.balance / spend.total_per_hour : Infinity;
          const running = vms.filter((v) => v.status === 'running');
          const low = balance.balance <= 0 || hoursLeft < LOW_HOURS;
          return (
            <>
              {low ? (
                <div class="warning" role="alert">
                  {balance.balance <= 0
                    ? 'Your balance is empty: running VMs are stopped and new ones cannot start until you add credit.'
                    : `Low balance: at the current spend your credit lasts about ${Math.max(0, Math.floor(hoursLeft))} more hours. Running VMs stop when it runs out.`}
                </div>
              ) : null}
              <div class="cards">
                <div class="card stat">
                  <span class="label">Balance</span>
                  <strong class="value" data-testid="balance">
                    <Money value={balance.balance} currency={balance.currency} />
                  </strong>
                </div>
                <div class="card stat">
                  <span class="label">Spend now</span>
                  <strong class="value">
                    <Money value={spend.total_per_hour} currency={balance.currency} precise perHour />
                  </strong>
                  <span class="muted">
                    {Number.isFinite(hoursLeft)
                      ? `about ${hoursLeft >= 1000 ? '1000+' : Math.floor(hoursLeft)} h of credit left`
                      : 'nothing accrues now'}
                  </span>
                </div>
                <div class="card stat">
                  <span class="label">Running VMs</span>
                  <strong class="value">{running.length}</strong>
                  <span class="muted">{vms.filter((v) => v.status !== 'destroyed').length} in all</span>
                </div>
              </div>
              <h2>Running now</h2>
              {running.length === 0 ? (
                <Empty>
                  No VM is running. <Link href="/offers">Find a GPU</Link>
                </Empty>
              ) : (
                <Table
                  head={
                    <>
                      <th>VM</th>
                      <th>GPUs</th>
                      <th>Status</th>
                      <th>Rate</th>
                    </>
                  }
                >
                  {running.map((v) => (
                    <tr key={v.id}>
                      <td>
                        <Link href={`/vms/${v.id}`} title={`ID ${v.id}`}>
                          {vmName(v)}
                        </Link>
                      </td>
                      <td>
                        {v.gpu_count} × {v.gpu_type}
                      </td>
                      <td>
                        <Status status={v.status} />
                      </td>
                      <td>
                        <Money value={v.hourly_rate} currency={balance.currency} precise perHour />
                      </td>
                    </tr>
                  ))}
                </Table>
              )}
            </>
          );
        }}
      </Loaded>
    </Page>
  );
}
