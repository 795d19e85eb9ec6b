/**
 * The console's small component kit, one file per kind under ui/, named here
 * so a page imports it from one place. Plain elements with their native
 * roles, so everything is reachable by keyboard and named for screen readers.
 * - ui/base.tsx: links, the page header, loading data, notices and errors;
 * - ui/forms.tsx: forms that cannot double-submit, fields and buttons;
 * - ui/dialogs.tsx: the confirm dialog and the form dialog;
 * - ui/tables.tsx: tables, the pager and paged lists;
 * - ui/display.tsx: money, times, durations, status badges, copy buttons.
 */
export { Link, Page, useAsync, Loaded, Empty, notify, Notices, ErrorText, type Async } from './ui/base.js';
export { Form, Submit, Action, RowButton, Field, Select, parseIntField, useDebounced } from './ui/forms.js';
export { Confirm, FormDialog } from './ui/dialogs.js';
export { Table, Pager, usePaged, PagedTable, type Paged } from './ui/tables.js';
export {
  formatMoney,
  Money,
  formatTime,
  formatInstants,
  WithTimes,
  formatDuration,
  vmName,
  Status,
  CopyButton,
} from './ui/display.js';
