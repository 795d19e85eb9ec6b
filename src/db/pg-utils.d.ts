/** The one function of node-postgres's utils module the embedded database uses (db/pglite-statement.ts). */
declare module 'pg/lib/utils.js' {
  const utils: {
    /** A parameter as node-postgres sends it: text (dates, arrays, objects as JSON), a Buffer, or null. */
    prepareValue(value: unknown): string | Buffer | null | undefined;
  };
  export default utils;
}
