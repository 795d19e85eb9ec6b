/**
 * The next moment background work comes due, for the manual clock's stepping
 * advance: the earliest of the candidates each kind of work gives (a hypervisor
 * action, a reservation end, the billing boundary at which a balance could reach
 * zero; the boundaries before it are closed in bulk wherever the advance stops
 * next). Null when nothing is due.
 */
export function earliest(candidates: readonly (number | null)[]): number | null {
  const due = candidates.filter((c): c is number => c !== null);
  return due.length ? Math.min(...due) : null;
}
