/**
 * Tables and the lists the API pages: Table (the scrolling wrapper, caption,
 * header row and body every table of the console has), Pager ("1–50 of 123"
 * with Previous / Next), usePaged (one page of a limit/offset list) and
 * PagedTable (such a list as a table, its empty text, and its pager).
 */
import type { ComponentChildren } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { Empty, Loaded, useAsync, type Async } from './base.js';

/** A table in its scrolling wrapper: `head` holds the header cells, `children` the rows. */
export function Table(props: {
  head: ComponentChildren;
  children: ComponentChildren;
  class?: string;
  /** A class for the wrapper besides `table-wrap`. */
  wrapClass?: string;
  caption?: ComponentChildren;
  captionClass?: string;
}) {
  return (
    <div class={props.wrapClass ? `table-wrap ${props.wrapClass}` : 'table-wrap'}>
      <table class={props.class}>
        {props.caption !== undefined ? <caption class={props.captionClass}>{props.caption}</caption> : null}
        <thead>
          <tr>{props.head}</tr>
        </thead>
        <tbody>{props.children}</tbody>
      </table>
    </div>
  );
}

/** "1–50 of 123" with Previous / Next; nothing when everything fits on one page. */
export function Pager(props: {
  offset: number;
  limit: number;
  total: number;
  shown: number;
  onOffset: (o: number) => void;
  noun: string;
}) {
  const { offset, limit, total, shown, onOffset, noun } = props;
  if (total <= limit && offset === 0) return null;
  return (
    <nav class="actions adm-pager" aria-label={`Pages of ${noun}`}>
      <span class="muted">
        {shown === 0 ? `${total} ${noun} in all` : `${offset + 1}–${offset + shown} of ${total} ${noun}`}
      </span>
      <button
        type="button"
        class="btn btn-plain btn-small"
        disabled={offset === 0}
        onClick={() => onOffset(Math.max(0, offset - limit))}
      >
        Previous
      </button>
      <button
        type="button"
        class="btn btn-plain btn-small"
        disabled={offset + limit >= total}
        onClick={() => onOffset(offset + limit)}
      >
        Next
      </button>
    </nav>
  );
}

/** A page of a list the API pages, with where it starts and how to move. */
export interface Paged<T> extends Async<{ items: T[]; total: number }> {
  offset: number;
  limit: number;
  setOffset: (offset: number) => void;
}

/**
 * Reads one page of `limit` items of a list (`load` gets the page to read) and
 * again when `filters` or the page change; a change of filters goes back to
 * the first page. With `pollMs`, read again as useAsync does.
 */
export function usePaged<T>(
  load: (page: { limit: number; offset: number }) => Promise<{ items: T[]; total: number }>,
  opts: { limit: number; filters?: unknown[]; pollMs?: number },
): Paged<T> {
  const { limit, filters = [], pollMs } = opts;
  const [offset, setOffset] = useState(0);
  // Runs again only when a filter changes.
  useEffect(() => setOffset(0), filters);
  const list = useAsync(() => load({ limit, offset }), [...filters, offset], pollMs);
  return { ...list, offset, limit, setOffset };
}

/**
 * A paged list as a table with its pager, or `empty` when the page holds
 * nothing (with `pagerWhenEmpty` the pager too, so a page past the end leads
 * back). `noun` names the items in the pager.
 */
export function PagedTable<T>(props: {
  list: Paged<T>;
  noun: string;
  empty: ComponentChildren;
  pagerWhenEmpty?: boolean;
  head: ComponentChildren;
  row: (item: T) => ComponentChildren;
  class?: string;
  /** A caption only screen readers read. */
  caption?: string;
}) {
  const { list, noun } = props;
  const pager = (total: number, shown: number) => (
    <Pager offset={list.offset} limit={list.limit} total={total} shown={shown} onOffset={list.setOffset} noun={noun} />
  );
  return (
    <Loaded value={list}>
      {({ items, total }) =>
        items.length === 0 ? (
          <>
            <Empty>{props.empty}</Empty>
            {props.pagerWhenEmpty ? pager(total, 0) : null}
          </>
        ) : (
          <>
            <Table
              class={props.class}
              caption={props.caption}
              captionClass={props.caption !== undefined ? 'adm-sr' : undefined}
              head={props.head}
            >
              {items.map(props.row)}
            </Table>
            {pager(total, items.length)}
          </>
        )
      }
    </Loaded>
  );
}
